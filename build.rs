//! Joins the Lua files into the one script the worker sends, and embeds it
//! with its SHA1 so `EVALSHA` needs no hashing at run time.

use std::{env, fs, path::Path};

/// The order matters: each part uses locals the earlier ones define.
const PARTS: [&str; 5] = [
    "lua/common.lua",
    "lua/gcra.lua",
    "lua/windowed.lua",
    "lua/penalty.lua",
    "lua/limiter.lua",
];

/// Hosted Upstash then locks only the keys in `KEYS`, not the whole database;
/// our scripts touch no other key, which is what that flag promises.
const SHEBANG: &str = "#!lua flags=allow-key-locking\n";

fn main() {
    let mut source = String::from(SHEBANG);
    for part in PARTS {
        println!("cargo:rerun-if-changed={part}");
        let text = fs::read_to_string(part).unwrap_or_else(|e| panic!("reading {part}: {e}"));
        source.push_str(&text);
        if !text.ends_with('\n') {
            source.push('\n');
        }
    }
    let sha1 = sha1_smol::Sha1::from(source.as_bytes())
        .digest()
        .to_string();
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Path::new(&out_dir);
    fs::write(out.join("limiter.lua"), &source).expect("writing the joined script");
    fs::write(out.join("limiter.sha1"), sha1).expect("writing the script's SHA1");
}
