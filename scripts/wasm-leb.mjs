// Reads an unsigned LEB128 number, as the wasm format writes sizes and
// counts: the value at `at` in `bytes`, and where it ends.
export function leb(bytes, at) {
  let value = 0;
  let shift = 0;
  let byte;
  do {
    byte = bytes[at++];
    value += (byte & 0x7f) * 2 ** shift;
    shift += 7;
  } while (byte & 0x80);
  return [value, at];
}
