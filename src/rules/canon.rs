//! Canonical forms of what identifies a client or selects a rule, so that
//! no other spelling of the same value escapes its bucket or its rule.
//!
//! The guiding rule: whatever an origin may read as one value must map to
//! one canonical form here. Origins differ (one decodes `+` as a space,
//! another keeps it; one decodes twice; one strips cookie quotes), so the
//! canonical form merges every spelling any of them would merge. Merging
//! two spellings into one bucket can only tighten a limit; splitting one
//! client into many buckets would be a way around it.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

/// Percent-decoding passes: an origin behind a proxy that decodes too sees
/// a value decoded twice, so `%2561` must count as `a`. A bound keeps a
/// crafted `%25252525...` from costing more than a few passes over it.
const DECODE_PASSES: usize = 3;

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The UTF-16 unit of a `%uXXXX` escape at the start of `input`: IIS
/// (http.sys, whose default allows them) and classic ASP.NET's `UrlDecode`
/// read it as that character, so `%u0061` is an `a` to them.
fn u_escape(input: &[u8]) -> Option<u16> {
    match input {
        [b'%', b'u' | b'U', digits @ ..] if digits.len() >= 4 => digits[..4]
            .iter()
            .try_fold(0u16, |unit, &d| Some(unit * 16 + u16::from(hex(d)?))),
        _ => None,
    }
}

/// One pass of percent-decoding: `%XX`, and `%uXXXX` as UTF-8 (a surrogate
/// pair as its character, a lone surrogate as U+FFFD). An escape that is
/// neither stays as it is, as browsers and URL parsers keep it.
fn decode_once(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if let Some(unit) = u_escape(&input[i..]) {
            let high = u32::from(unit).wrapping_sub(0xD800);
            let low = u_escape(&input[i + 6..])
                .map(|low| u32::from(low).wrapping_sub(0xDC00))
                .filter(|low| high < 0x400 && *low < 0x400);
            let (code, len) = match low {
                Some(low) => (0x10000 + (high << 10) + low, 12),
                None => (u32::from(unit), 6),
            };
            // A surrogate on its own is no character: U+FFFD.
            let c = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            i += len;
            continue;
        }
        match (
            input[i],
            input.get(i + 1).copied().and_then(hex),
            input.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi * 16 + lo);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fn has_escape(input: &[u8]) -> bool {
    (0..input.len()).filter(|&i| input[i] == b'%').any(|i| {
        let w = &input[i..];
        u_escape(w).is_some()
            || matches!(w, [_, hi, lo, ..] if hex(*hi).is_some() && hex(*lo).is_some())
    })
}

/// Percent-escapes decoded, up to 3 times (`DECODE_PASSES`), as bytes, and
/// cut at the first NUL byte (see [`before_nul_bytes`]).
pub fn percent_decoded(raw: &str) -> Cow<'_, [u8]> {
    let mut bytes = Cow::Borrowed(raw.as_bytes());
    for _ in 0..DECODE_PASSES {
        if !has_escape(&bytes) {
            break;
        }
        bytes = Cow::Owned(decode_once(&bytes));
    }
    match bytes {
        Cow::Borrowed(b) => Cow::Borrowed(before_nul_bytes(b)),
        Cow::Owned(mut b) => {
            b.truncate(before_nul_bytes(&b).len());
            Cow::Owned(b)
        }
    }
}

/// Bytes up to the first NUL. An origin written in C, or handing values to
/// C code (file names, many database drivers), reads `a\0xyz` as `a`: kept
/// whole, every suffix would be a fresh bucket for the same client.
pub fn before_nul_bytes(bytes: &[u8]) -> &[u8] {
    bytes.split(|&b| b == 0).next().unwrap_or_default()
}

/// Text up to its first NUL, as [`before_nul_bytes`] (NUL is ASCII, so the
/// cut never splits a character).
pub fn before_nul(text: &str) -> &str {
    &text[..before_nul_bytes(text.as_bytes()).len()]
}

/// A path segment as Windows names a file: without the dots and spaces it
/// ends with, so that IIS serves `/admin.` and `/admin%20` as `/admin`.
pub fn windows_segment(segment: &str) -> &str {
    let end = segment
        .bytes()
        .rposition(|b| b != b'.' && b != b' ')
        .map_or(0, |last| last + 1);
    &segment[..end]
}

/// A path segment as origins resolve it: as Windows names it
/// ([`windows_segment`]), and as a number when it is digits alone
/// ([`number_or_uuid`]: `/items/0042` is item 42 to a route taking an
/// integer).
pub fn path_segment(segment: &str) -> Cow<'_, str> {
    number_or_uuid(Cow::Borrowed(windows_segment(segment)))
}

/// Bytes as text; bytes that are no UTF-8 become U+FFFD (which merges some
/// distinct byte strings: that only tightens).
fn text(bytes: Cow<'_, [u8]>) -> Cow<'_, str> {
    match bytes {
        Cow::Borrowed(b) => String::from_utf8_lossy(b),
        Cow::Owned(b) => match String::from_utf8(b) {
            Ok(s) => Cow::Owned(s),
            Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
        },
    }
}

/// [`form_value`] of text that may be a copy.
pub fn form_value_of(raw: Cow<'_, str>) -> Cow<'_, str> {
    match raw {
        Cow::Borrowed(raw) => form_value(raw),
        Cow::Owned(raw) => Cow::Owned(form_value(&raw).into_owned()),
    }
}

/// A form value (`application/x-www-form-urlencoded`, as in a query):
/// percent-escapes decoded, and every `+`, literal or escaped, read as a
/// space, since origins disagree on whether `+` or `%2B` means one.
pub fn form_value(raw: &str) -> Cow<'_, str> {
    let decoded = text(percent_decoded(raw));
    if decoded.contains('+') {
        Cow::Owned(decoded.replace('+', " "))
    } else {
        decoded
    }
}

/// The raw value of every field named `field` (canonical, see [`name`])
/// in form-encoded text, as often as given: a query, or an
/// `application/x-www-form-urlencoded` body. Fields are separated by `&`
/// and, as some servers also read them, `;`. Text that is not UTF-8 is
/// read as PHP reads it, its stray bytes as U+FFFD; [`form_value`] reads
/// a value.
pub fn form_fields<'a, 'f>(
    text: &'a [u8],
    field: &'f str,
) -> impl Iterator<Item = Cow<'a, str>> + use<'a, 'f> {
    text.split(|&b| b == b'&' || b == b';')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &pair[pair.len()..]),
        })
        .filter(move |(n, _)| is_name(&String::from_utf8_lossy(n), field))
        .map(|(_, v)| String::from_utf8_lossy(v))
}

/// `text` split at every byte `separator` holds, which must be ASCII (so
/// that no character is split): a byte at a time, where splitting by
/// character would decode each.
pub fn split_where(text: &str, separator: impl Fn(u8) -> bool) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t.bytes().position(&separator) {
            Some(at) => {
                rest = Some(&t[at + 1..]);
                Some(&t[..at])
            }
            None => rest.take(),
        }
    })
}

/// `text` split at its first `separator` (ASCII), as [`split_where`] finds it.
pub fn split_once_at(text: &str, separator: u8) -> Option<(&str, &str)> {
    let at = text.bytes().position(|b| b == separator)?;
    Some((&text[..at], &text[at + 1..]))
}

/// A value the origin compares without regard to case or surrounding
/// space (an account name, an e-mail address): trimmed, folded as
/// [`fold_char`] does and lower-cased, then its compatibility spellings and
/// accents read as [`plain_letters`] reads them.
pub fn folded(value: &str) -> String {
    // Case first: `ẞ` and the Angstrom sign have plain letters only in lower case.
    plain_letters(&fold(value.trim()).to_lowercase()).to_ascii_lowercase()
}

/// The base letter of each of U+00C0..=U+017F: `-` keeps the character,
/// `*` stands for two letters ([`two_letters`]).
const LATIN_BASES: &str = concat!(
    "aaaaaa*ceeeeiiiidnooooo-ouuuuy-*",
    "aaaaaa*ceeeeiiiidnooooo-ouuuuy-y",
    "aaaaaaccccccccddddeeeeeeeeeegggggggghhhhiiiiiiiiii**jjkkkllllllllll",
    "nnnnnnnnnoooooo**rrrrrrssssssssttttttuuuuuuuuuuuuwwyyyzzzzzzs",
);

/// The two letters of the characters [`LATIN_BASES`] marks with `*`.
fn two_letters(c: char) -> &'static str {
    match c {
        '\u{c6}' | '\u{e6}' => "ae",
        '\u{df}' => "ss",
        '\u{132}' | '\u{133}' => "ij",
        _ => "oe",
    }
}

/// Text with the spellings that NFKC (Django's usernames) or an accent-
/// and width-insensitive collation (MySQL's defaults) read as plain
/// letters and digits written as them: full-width forms, mathematical
/// and circled letters, ligatures, super- and subscript digits, Latin
/// letters without their accents, and combining marks dropped. Each of
/// them would otherwise be a fresh bucket for one account.
pub fn plain_letters(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        return Cow::Borrowed(text);
    }
    let offset = |c: char, from: u32| c as u32 - from;
    let letter = |n: u32| char::from(b'a' + (n % 26) as u8);
    let digit = |n: u32| char::from(b'0' + (n % 10) as u8);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c as u32 {
            0x300..=0x36F => {}
            0xB2 | 0xB3 => out.push(digit(offset(c, 0xB0))),
            0xB9 => out.push('1'),
            0xC0..=0x17F => match LATIN_BASES.as_bytes()[offset(c, 0xC0) as usize] {
                b'-' => out.push(c),
                b'*' => out.push_str(two_letters(c)),
                base => out.push(char::from(base)),
            },
            0x2070 | 0x2074..=0x2079 => out.push(digit(offset(c, 0x2070))),
            0x2080..=0x2089 => out.push(digit(offset(c, 0x2080))),
            0x24B6..=0x24E9 => out.push(letter(offset(c, 0x24B6))),
            0xFB00 => out.push_str("ff"),
            0xFB01 => out.push_str("fi"),
            0xFB02 => out.push_str("fl"),
            0xFB03 => out.push_str("ffi"),
            0xFB04 => out.push_str("ffl"),
            0xFB05 | 0xFB06 => out.push_str("st"),
            0xFF01..=0xFF5E => out.extend(char::from_u32(offset(c, 0xFEE0))),
            0x1D400..=0x1D6A3 => out.push(letter(offset(c, 0x1D400) % 52)),
            0x1D7CE..=0x1D7FF => out.push(digit(offset(c, 0x1D7CE))),
            _ => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A parameter or cookie name as compared with a rule's: decoded as a form
/// value, case folded (ASP.NET and others ignore the case of names, see
/// [`fold_char`]), spaces and brackets that start it dropped (PHP drops the
/// spaces, Rack the brackets: ` user` and `[user` are `user` to them), every
/// `]` dropped (Rack reads `user]` as `user`), and `.`, ` ` and `[` read as
/// `_`, as PHP rewrites them in names. Array brackets that end it (`[]`,
/// `[0]`) are dropped: PHP, Rack and Express read `user[]` as `user` (an
/// array, which Laravel's and Rails' lookups match by any element).
pub fn name(raw: &str) -> String {
    name_chars(&form_value(raw)).collect()
}

/// The characters of [`name`] of a decoded name, one at a time.
fn name_chars(decoded: &str) -> impl Iterator<Item = char> + '_ {
    let mut base = decoded.trim_start_matches([' ', '[', ']']);
    while let Some(open) = base.strip_suffix(']').and_then(|b| b.rfind('[')) {
        let index = &base[open + 1..base.len() - 1];
        if open == 0 || !index.bytes().all(|b| b.is_ascii_digit()) {
            break;
        }
        base = &base[..open];
    }
    base.chars().filter(|&c| c != ']').map(|c| match c {
        '.' | ' ' | '[' => '_',
        c => fold_char(c),
    })
}

/// Whether a parameter or cookie name reads as `wanted` (canonical), as
/// [`name`] reads it: compared as it is read, without building it.
pub fn is_name(raw: &str, wanted: &str) -> bool {
    // Letters, digits, `-` and `_` stay as they are, but for their case.
    if raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return raw.eq_ignore_ascii_case(wanted);
    }
    name_chars(&form_value(raw)).eq(wanted.chars())
}

/// A character as an origin that ignores case compares it: in lower case
/// (where that is one character: `É` is `é`, as ASP.NET Core's routing and
/// IIS compare them), and the four letters outside ASCII whose other case
/// is an ASCII letter taken as that letter. .NET's `OrdinalIgnoreCase`
/// equates `ı` with `i` and `ſ` with `s`; Java's `equalsIgnoreCase` also
/// `İ` with `i` and the Kelvin sign with `k`. So `/admın` cannot slip past
/// a rule for `/admin`.
pub fn fold_char(c: char) -> char {
    match c {
        '\u{130}' | '\u{131}' => 'i',
        '\u{17F}' => 's',
        '\u{212A}' => 'k',
        // A final sigma is a sigma: `ΝΙΚΟΣ` and `νικος` are one word.
        '\u{3C2}' => '\u{3C3}',
        c if c.is_ascii() => c.to_ascii_lowercase(),
        c => {
            let mut lower = c.to_lowercase();
            match (lower.next(), lower.next()) {
                (Some(one), None) => one,
                _ => c,
            }
        }
    }
}

/// Text with every character as [`fold_char`] gives it.
pub fn fold(text: &str) -> String {
    text.chars().map(fold_char).collect()
}

/// Strips one pair of surrounding double quotes (RFC 6265 allows a quoted
/// cookie value; Go, Express and others strip them).
fn unquoted(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// A cookie value: surrounding spaces and one pair of double quotes
/// stripped, then decoded as a form value (PHP and Express percent-decode
/// cookies), then quotes stripped once more (a quoted value sent escaped).
/// A quoted value loses its backslash escapes too, as Python's cookie
/// parser (Django, Werkzeug) reads `"\163\063"` and `"s\3"` as `s3`.
pub fn cookie_value(raw: &str) -> Cow<'_, str> {
    let trimmed = raw.trim();
    let value = unquoted(trimmed);
    let decoded = form_value(value);
    let inner = unquoted(&decoded);
    let quoted = value.len() < trimmed.len() || inner.len() < decoded.len();
    if quoted && inner.contains('\\') {
        return Cow::Owned(before_nul(&backslash_unescaped(inner)).to_owned());
    }
    match decoded {
        Cow::Borrowed(v) => Cow::Borrowed(unquoted(v)),
        Cow::Owned(v) => Cow::Owned(unquoted(&v).to_owned()),
    }
}

/// Text with Python's cookie escapes read: `\ooo` (three octal digits, the
/// first at most 3) as that byte's character, `\c` as `c`.
fn backslash_unescaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((before, after)) = rest.split_once('\\') {
        out.push_str(before);
        let octal = match after.as_bytes() {
            [a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', ..] => {
                Some((a - b'0') * 64 + (b - b'0') * 8 + (c - b'0'))
            }
            _ => None,
        };
        rest = match (octal, after.chars().next()) {
            (Some(byte), _) => {
                out.push(char::from(byte));
                &after[3..]
            }
            (None, Some(c)) => {
                out.push(c);
                &after[c.len_utf8()..]
            }
            (None, None) => {
                out.push('\\');
                ""
            }
        };
    }
    out.push_str(rest);
    out
}

/// A client address as a bucket: an IPv4 address as written canonically,
/// an IPv6 address as its /64 prefix (one subscriber is routed a whole /64
/// and can pick any address in it), an IPv4-mapped IPv6 address as the
/// IPv4 one. Text that is no address is kept as it is.
pub fn ip(raw: &str) -> Cow<'_, str> {
    match raw.trim().parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => {
            let canonical = v4.to_string();
            if canonical == raw {
                Cow::Borrowed(raw)
            } else {
                Cow::Owned(canonical)
            }
        }
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => Cow::Owned(v4.to_string()),
            None => {
                let s = v6.segments();
                let prefix = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                Cow::Owned(format!("{prefix}/64"))
            }
        },
        Err(_) => Cow::Borrowed(raw),
    }
}

/// The last address of an `X-Forwarded-For` list: the one the deployment's
/// trusted proxy appended. The ones before it are whatever the client sent.
pub fn last_forwarded(list: &str) -> &str {
    list.rsplit(',').next().unwrap_or(list).trim()
}

/// The client of an `X-Forwarded-For` list as [`ip`] counts it: the last
/// address, without the port some proxies append (`1.2.3.4:56789`,
/// `[2001:db8::1]:443`), so that neither a new port nor another address
/// in the client's /64 is a new bucket.
pub fn forwarded_client(list: &str) -> Cow<'_, str> {
    let last = last_forwarded(list);
    let host = match last.strip_prefix('[').and_then(|v| v.split_once(']')) {
        Some((v6, _)) => v6,
        None => match last.split_once(':') {
            Some((v4, port)) if !port.contains(':') => v4,
            _ => last,
        },
    };
    ip(host)
}

/// An `Authorization` value as servers read it: the scheme in any case
/// and any run of spaces or tabs after it (Spring Security, ASP.NET Core
/// and Passport all accept `bearer` and extra spaces), as `scheme token`;
/// `basic` credentials as `base64_bytes` reads them.
pub fn credentials(value: &str) -> Cow<'_, str> {
    let value = value.trim();
    match value.split_once([' ', '\t']) {
        Some((scheme, rest)) => {
            let scheme = scheme.to_ascii_lowercase();
            let token = rest.trim_start_matches([' ', '\t']);
            Cow::Owned(match scheme.as_str() {
                "basic" => format!("basic {}", base64_bytes(token)),
                _ => format!("{scheme} {token}"),
            })
        }
        None => Cow::Borrowed(value),
    }
}

/// The bytes base64 `text` holds, written as canonical base64: what is not
/// base64 skipped (Python's `b64decode`, which Werkzeug and DRF use), a
/// missing `=` and stray low bits accepted (Node's `Buffer`, Java's
/// decoder), so that every spelling of one credential is one.
fn base64_bytes(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextet = |b: u8| match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    // Whole groups of four sextets are three bytes, written back as the
    // same four; only the last, short group changes.
    let mut out: Vec<u8> = Vec::with_capacity(text.len() + 2);
    out.extend(text.bytes().filter(|&b| sextet(b).is_some()));
    let whole = out.len() / 4 * 4;
    let tail: Vec<u8> = out[whole..].iter().filter_map(|&b| sextet(b)).collect();
    out.truncate(whole);
    // Two sextets hold one byte (its low four bits spare), three hold two
    // (two bits spare), one holds none.
    let (kept, spare, pad) = match tail.len() {
        2 => (2, 0b1111, "=="),
        3 => (3, 0b11, "="),
        _ => (0, 0, ""),
    };
    for (i, &s) in tail.iter().take(kept).enumerate() {
        let s = if i + 1 == kept { s & !spare } else { s };
        out.push(ALPHABET[usize::from(s)]);
    }
    out.extend_from_slice(pad.as_bytes());
    // Only bytes of the alphabet and `=`: ASCII.
    String::from_utf8(out).unwrap_or_default()
}

/// A value as an origin that parses it reads it: an integer, however
/// written, as its shortest ASCII digits (`integer`: `0123`, `+123`,
/// ` 123`, `123.0`, `1.23e2`, `0x7b`, `1_23` and `١٢٣` are `123`; `-0` is
/// `0`), a UUID as its lower-case hyphenated form (`uuid`); any other
/// value as it is. An origin taking the value as a number (`<int:pk>`, a
/// `long` parameter, `int()`, `Number()`, a cast in SQL) or a UUID reads
/// every such spelling as one id.
pub fn number_or_uuid(value: Cow<'_, str>) -> Cow<'_, str> {
    // Trimmed first, as an origin that trims (Django's forms) reads ` 0042`.
    let text = value.trim();
    let (minus, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    // Only a digit or `.` starts an integer, and a UUID takes 32 digits.
    let integer_start = unsigned.chars().next().is_some_and(|c| {
        c == '.' || c.is_ascii_digit() || !c.is_ascii() && decimal_digit(c).is_some()
    });
    if !integer_start && text.len() < 32 {
        return value;
    }
    // Plain digits, the commonest number: their leading zeros dropped.
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        let digits = match unsigned.trim_start_matches('0') {
            "" => "0",
            n if n.len() > MOST_DIGITS => return value,
            n => n,
        };
        if minus && digits != "0" {
            return Cow::Owned(format!("-{digits}"));
        }
        // The digits lie in the value: as long, they are the value.
        if value.len() == digits.len() {
            return value;
        }
        return Cow::Owned(digits.to_owned());
    }
    let canonical = match integer(unsigned) {
        Some(n) if minus && n != "0" => format!("-{n}"),
        Some(n) => n,
        None => match uuid(text) {
            Some(u) => u,
            None => return value,
        },
    };
    if canonical == *value {
        value
    } else {
        Cow::Owned(canonical)
    }
}

/// Digits of the longest integer read as one.
const MOST_DIGITS: usize = 40;

/// The shortest decimal digits of the unsigned integer `text` writes, if
/// it writes one: in decimal with digits of any script and `_` between
/// them (Python's `int()`), a fraction of zeros (Django's IntegerField,
/// JS `Number()`) or an exponent (JS, PHP's `(int)`, MySQL's casts), or
/// with `0x`, `0o` or `0b` (JS `Number()`). At most 40 digits.
fn integer(text: &str) -> Option<String> {
    let radix = match text.as_bytes() {
        [b'0', b'x' | b'X', ..] => 16,
        [b'0', b'o' | b'O', ..] => 8,
        [b'0', b'b' | b'B', ..] => 2,
        _ => 10,
    };
    if radix != 10 {
        let rest = &text[2..];
        if rest.is_empty() || !rest.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        return u64::from_str_radix(rest, radix).ok().map(|n| n.to_string());
    }
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let fraction = ascii_digits(fraction)?;
    let digits = ascii_digits(whole)? + &fraction;
    if digits.is_empty() || exponent.unsigned_abs() as usize > MOST_DIGITS {
        return None;
    }
    // The value is `digits` x 10^shift: whole when the digits shifted out
    // are zeros.
    let shift = exponent - fraction.len() as i32;
    let kept = digits.trim_start_matches('0');
    let integer = match usize::try_from(-shift) {
        Ok(cut) if cut >= kept.len() => kept.bytes().all(|b| b == b'0').then(String::new)?,
        Ok(cut) => {
            let (head, tail) = kept.split_at(kept.len() - cut);
            tail.bytes().all(|b| b == b'0').then(|| head.to_owned())?
        }
        Err(_) => kept.to_owned() + &"0".repeat(shift as usize),
    };
    match integer.trim_start_matches('0') {
        "" => Some("0".to_owned()),
        n if n.len() <= MOST_DIGITS => Some(n.to_owned()),
        _ => None,
    }
}

/// Decimal digits of any script, with `_` between them (Python's `int()`),
/// as ASCII digits; `None` for anything else.
fn ascii_digits(part: &str) -> Option<String> {
    if part.starts_with('_') || part.ends_with('_') {
        return None;
    }
    part.chars()
        .filter(|&c| c != '_')
        .map(|c| Some(char::from(b'0' + decimal_digit(c)?)))
        .collect()
}

/// A UUID as its lower-case hyphenated form, however Python's `uuid.UUID`,
/// .NET's `Guid.Parse` or Postgres write it: any case, hyphens anywhere or
/// none, in braces or parentheses, after `urn:uuid:`.
fn uuid(text: &str) -> Option<String> {
    let bare = match text.get(..9) {
        Some(urn) if urn.eq_ignore_ascii_case("urn:uuid:") => &text[9..],
        _ => text,
    };
    let bare = [('{', '}'), ('(', ')')]
        .into_iter()
        .find_map(|(open, close)| bare.strip_prefix(open)?.strip_suffix(close))
        .unwrap_or(bare);
    // 32 digits and their hyphens; nothing else needs reading.
    if !(32..=64).contains(&bare.len()) {
        return None;
    }
    let h: String = bare
        .chars()
        .filter(|&c| c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if h.len() != 32 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// The zero of every run of ten decimal digits Unicode has (category Nd),
/// through Unicode 15.
const DIGIT_ZEROS: [u32; 68] = [
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650,
    0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x11F50, 0x16A60, 0x16AC0,
    0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E4F0, 0x1E950,
    0x1FBF0,
];

/// The value of a decimal digit of any script, as Python's `int()` and
/// Java's `Character.digit` read it.
fn decimal_digit(c: char) -> Option<u8> {
    let c = u32::from(c);
    let at = DIGIT_ZEROS
        .partition_point(|&zero| zero <= c)
        .checked_sub(1)?;
    let d = c - DIGIT_ZEROS[at];
    // Below 10, so the cast keeps it whole.
    (d < 10).then_some(d as u8)
}

/// The path as origins most likely resolve it, so that no other spelling
/// of a limited path escapes its rule or its key: percent-escapes decoded
/// (`%2F` included, and twice-encoded ones), `\` read as `/`, `.` and `..`
/// segments resolved, `;` parameters (`/login;jsessionid=x`) dropped from
/// each segment as Java servers do, dots and spaces that end a segment
/// dropped as Windows drops them from file names (IIS serves `/admin.` as
/// `/admin`), empty segments and a trailing `/` dropped, and case folded
/// ([`fold`]), since many origins route without regard to case.
/// Bytes that are not UTF-8 after decoding become U+FFFD.
pub fn normalize_path(raw: &str) -> String {
    resolved(&percent_decoded(raw), true)
}

/// A decoded path with its segments resolved, as [`normalize_path`] says,
/// numbers without their leading zeros if `numbers`.
fn resolved(decoded: &[u8], numbers: bool) -> String {
    let text = String::from_utf8_lossy(decoded);
    let mut path = String::with_capacity(text.len() + 1);
    for segment in split_where(&text, |b| b == b'/' || b == b'\\') {
        match split_once_at(segment, b';').map_or(segment, |(before, _)| before) {
            "" | "." => {}
            // Segments hold no `/`: the last one starts at the last `/`.
            ".." => path.truncate(path.rfind('/').unwrap_or(0)),
            s => match windows_segment(s) {
                "" => {}
                s => {
                    let s = match numbers {
                        true => number_or_uuid(Cow::Borrowed(s)),
                        false => Cow::Borrowed(s),
                    };
                    path.push('/');
                    if s.is_ascii() {
                        let at = path.len();
                        path.push_str(&s);
                        path[at..].make_ascii_lowercase();
                    } else {
                        path.extend(s.chars().map(fold_char));
                    }
                }
            },
        }
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

/// The path as [`normalize_path`] gives it, and the other paths an origin
/// may route the request to, for rules to match any of: the path decoded
/// fewer times (an origin that decodes once routes `/search/x%252F..`
/// below `/search`, which more passes resolve above it) or with its
/// numbers as written (for a pattern such as `/v/0*`), each also after a
/// PHP front controller (`/index.php/login` is `/login` to Laravel and
/// Symfony) and without a format suffix (`/login.json` is `/login` to
/// Rails). Keys use the normalized path alone. Each decoding pass is made
/// once.
pub fn path_and_routes(raw: &str) -> (String, Vec<String>) {
    let escaped = has_escape(raw.as_bytes());
    let once = match escaped {
        true => Cow::Owned(decode_once(raw.as_bytes())),
        false => Cow::Borrowed(raw.as_bytes()),
    };
    let mut full = Cow::Borrowed(&*once);
    for _ in 1..DECODE_PASSES {
        if !has_escape(&full) {
            break;
        }
        full = Cow::Owned(decode_once(&full));
    }
    let full = before_nul_bytes(&full);
    let canonical = resolved(full, true);
    let mut bases = vec![canonical.clone(), resolved(full, false)];
    if escaped {
        for decoded in [raw.as_bytes(), &once] {
            bases.push(resolved(before_nul_bytes(decoded), true));
        }
    }
    bases.dedup();
    let mut routes: Vec<String> = Vec::new();
    for base in bases {
        let (script, routed) = php_script(&base)
            .map(|(script, routed)| (script.to_owned(), routed))
            .unzip();
        let formats = [Some(&base), routed.as_ref()].map(|p| p.and_then(|p| without_format(p)));
        for path in [Some(base.clone()), routed.clone(), script]
            .into_iter()
            .chain(formats)
            .flatten()
        {
            if path != canonical && !routes.contains(&path) {
                routes.push(path);
            }
        }
    }
    (canonical, routes)
}

/// The first `.php` segment of a path and what follows it: the script
/// that runs (Apache and nginx run `/wp-login.php/x` as `/wp-login.php`)
/// and the path a front controller routes on (`/index.php/login` is
/// `/login`).
fn php_script(path: &str) -> Option<(&str, String)> {
    let mut end = 0;
    for segment in path.split('/') {
        end += segment.len();
        if segment.ends_with(".php") {
            let rest = match &path[end..] {
                "" => "/".to_owned(),
                rest => rest.to_owned(),
            };
            return Some((&path[..end], rest));
        }
        end += 1;
    }
    None
}

/// The path without the format its last segment ends with, from its first
/// dot (`/login.json` and `/login.tar.gz` are `/login` to Rails routes).
fn without_format(path: &str) -> Option<String> {
    let (dir, last) = path.rsplit_once('/')?;
    match last.find('.') {
        Some(dot) if dot > 0 => Some(format!("{dir}/{}", &last[..dot])),
        _ => None,
    }
}

/// A request's host as rules match it: lower case, and without the
/// trailing dot of a fully qualified name (`example.com.` is the same
/// site, and would otherwise slip past a rule for `example.com`).
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_merge_every_spelling() {
        for (raw, canonical) in [
            ("a", "a"),
            ("%61", "a"),
            ("%2561", "a"),
            ("%252561", "a"),
            ("a+b", "a b"),
            ("a%20b", "a b"),
            ("a%2Bb", "a b"),
            ("a%2bb", "a b"),
            ("%zz", "%zz"),
            ("%", "%"),
            ("%%61", "%a"),
            ("%E2%82%AC", "\u{20ac}"),
            ("%ff", "\u{fffd}"),
            ("", ""),
            ("a%00", "a"),
            ("a%00b", "a"),
            ("a%2500b", "a"),
            ("%00", ""),
            ("%u0061", "a"),
            ("%U0041%u00e9", "A\u{e9}"),
            ("%u20AC", "\u{20ac}"),
            ("%uD83D%uDE00", "\u{1f600}"),
            ("%uD83Dx", "\u{fffd}x"),
            ("%uD83D%u0061", "\u{fffd}a"),
            ("%uDE00", "\u{fffd}"),
            ("%u25u0061", "%u25u0061"),
            ("%25u0061", "a"),
            ("%u0025u0061", "a"),
            ("%u006", "%u006"),
            ("%u0000b", ""),
        ] {
            assert_eq!(form_value(raw), canonical, "{raw}");
        }
    }

    #[test]
    fn decoding_is_bounded_on_crafted_input() {
        let layered = format!("%{}61", "25".repeat(10_000));
        let out = form_value(&layered);
        assert!(out.len() > 10_000, "at most a few passes");
    }

    #[test]
    fn names_fold_case_escapes_and_php_mangling() {
        assert_eq!(name("K"), "k");
        assert_eq!(name("%6B"), "k");
        assert_eq!(name("a.b"), "a_b");
        assert_eq!(name("a b"), "a_b");
        assert_eq!(name("a+b"), "a_b");
        assert_eq!(name("a[b"), "a_b");
        assert_eq!(name("u\u{17F}er"), "user");
        assert_eq!(name("%E2%84%AAey"), "key");
        assert_eq!(name("\u{130}d"), "id");
        // PHP drops the spaces a name starts with; Rack the brackets around it.
        for spelling in ["+user", "%20user", "user]", "[user", "]]user]"] {
            assert_eq!(name(spelling), "user", "{spelling}");
        }
        assert_eq!(name("user[email]]"), name("user[email]"));
        // An array of a name is that name, nested names stay apart.
        for spelling in ["user[]", "user[0]", "user[][]", "USER%5B%5D"] {
            assert_eq!(name(spelling), "user", "{spelling}");
        }
        assert_eq!(name("user[email]"), "user_email");
        assert_eq!(name("user[email][]"), "user_email");
    }

    #[test]
    fn a_forwarded_client_is_an_address_without_its_port() {
        assert_eq!(
            forwarded_client("spoofed, 203.0.113.1:56789"),
            "203.0.113.1"
        );
        assert_eq!(forwarded_client("203.0.113.1"), "203.0.113.1");
        assert_eq!(forwarded_client("[2001:db8::1]:443"), "2001:db8::/64");
        assert_eq!(forwarded_client("2001:db8::9"), "2001:db8::/64");
        assert_eq!(forwarded_client("not an address"), "not an address");
    }

    #[test]
    fn credentials_ignore_the_schemes_case_and_the_space_after_it() {
        for spelling in ["Bearer abc", "bearer abc", "BEARER \t  abc", " Bearer abc "] {
            assert_eq!(credentials(spelling), "bearer abc", "{spelling:?}");
        }
        // The token itself keeps its case.
        assert_eq!(credentials("Bearer ABC"), "bearer ABC");
        assert_eq!(credentials("abc"), "abc");
        // Basic credentials as the bytes they hold: `key1:` however written.
        for spelling in [
            "Basic a2V5MTo=",
            "basic a2V5MTo",
            "Basic a2V5MTp=",
            "Basic a2V5!MTo=",
            "Basic a2V5.M~To=",
            "BASIC  a2V5 MTo=",
        ] {
            assert_eq!(credentials(spelling), "basic a2V5MTo=", "{spelling}");
        }
        assert_eq!(credentials("Basic YQ"), "basic YQ==");
        assert_eq!(credentials("Basic YWI"), "basic YWI=");
        assert_eq!(credentials("Basic YWJj"), "basic YWJj");
        assert_eq!(credentials("Basic Y"), "basic ");
        assert_eq!(credentials("Basic "), "Basic");
    }

    #[test]
    fn numbers_lose_their_leading_zeros() {
        let d = |v: &str| number_or_uuid(Cow::Borrowed(v)).into_owned();
        assert_eq!(d("0123"), "123");
        assert_eq!(d(" 0042 "), "42");
        assert_eq!(d("000"), "0");
        assert_eq!(d("0"), "0");
        assert_eq!(d("123"), "123");
        assert_eq!(d(" 42"), "42");
        assert_eq!(d("+0042"), "42");
        assert_eq!(d("-0042"), "-42");
        assert_eq!(d("-000"), "0");
        assert_eq!(d("+"), "+");
        assert_eq!(d("--1"), "--1");
        assert_eq!(d("1-"), "1-");
        assert_eq!(d("42."), "42");
        assert_eq!(d("042.000"), "42");
        assert_eq!(d("4_2"), "42");
        assert_eq!(d("\u{664}\u{662}"), "42");
        assert_eq!(d("\u{FF14}\u{FF12}"), "42");
        assert_eq!(d("\u{1D7DC}2"), "42");
        assert_eq!(d("42.5"), "42.5");
        assert_eq!(d("_42"), "_42");
        assert_eq!(d("42_"), "42_");
        assert_eq!(d("."), ".");
        assert_eq!(d("-."), "-.");
        assert_eq!(d("\u{669}\u{66A}"), "\u{669}\u{66A}");
        assert_eq!(d("0x1"), "1");
        assert_eq!(d("0X2a"), "42");
        assert_eq!(d("0o52"), "42");
        assert_eq!(d("0b101010"), "42");
        assert_eq!(d("0xg"), "0xg");
        assert_eq!(d("0x"), "0x");
        assert_eq!(d("4.2e1"), "42");
        assert_eq!(d("420E-1"), "42");
        assert_eq!(d("42e0"), "42");
        assert_eq!(d("-4.2e+1"), "-42");
        assert_eq!(d("1e3"), "1000");
        assert_eq!(d("4.25e1"), "4.25e1");
        assert_eq!(d("5e-1"), "5e-1");
        assert_eq!(d("1e41"), "1e41");
        assert_eq!(d("1e99999999999"), "1e99999999999");
        assert_eq!(d("0.0"), "0");
        assert_eq!(d("e5"), "e5");
        assert_eq!(d("1e"), "1e");
        assert_eq!(d("01a"), "01a");
        assert_eq!(d(""), "");
        assert_eq!(normalize_path("/items/0042/"), "/items/42");
        assert_eq!(normalize_path("/items/+42"), "/items/42");
    }

    #[test]
    fn uuids_are_lower_case_and_hyphenated() {
        let canonical = "550e8400-e29b-41d4-a716-446655440000";
        for spelling in [
            canonical,
            "550E8400-E29B-41D4-A716-446655440000",
            "550e8400e29b41d4a716446655440000",
            "{550e8400-e29b-41d4-a716-446655440000}",
            "(550e8400-e29b-41d4-a716-446655440000)",
            "urn:uuid:550e8400-e29b-41d4-a716-446655440000",
            "550e-8400-e29b-41d4-a716-4466-5544-0000",
            " 550e8400-e29b-41d4-a716-446655440000 ",
        ] {
            assert_eq!(
                number_or_uuid(Cow::Borrowed(spelling)),
                canonical,
                "{spelling}"
            );
        }
        for other in [
            "550e8400-e29b-41d4-a716-44665544000",
            "550e8400-e29b-41d4-a716-44665544000g",
        ] {
            assert_eq!(number_or_uuid(Cow::Borrowed(other)), other);
        }
        assert_eq!(
            normalize_path("/u/{550E8400E29B41D4A716446655440000}"),
            format!("/u/{canonical}")
        );
    }

    #[test]
    fn other_routes_of_a_path_are_listed() {
        let routes = |raw: &str| {
            let (path, routes) = path_and_routes(raw);
            assert_eq!(path, normalize_path(raw), "{raw}");
            routes
        };
        assert_eq!(routes("/login"), Vec::<String>::new());
        assert_eq!(routes("/index.php/login"), ["/login", "/index.php"]);
        assert_eq!(routes("/login.json"), ["/login"]);
        assert_eq!(
            routes("/INDEX.PHP/login.json"),
            ["/login.json", "/index.php", "/index.php/login", "/login"]
        );
        // PATH_INFO: the script runs whatever follows it.
        assert_eq!(routes("/wp-login.php/x"), ["/x", "/wp-login.php"]);
        assert_eq!(routes("/index.php"), ["/", "/index"]);
        assert_eq!(routes("/index.phpx/login"), Vec::<String>::new());
        // Decoded three times the `..` climbs above /api/search; decoded
        // once or not at all, it stays below.
        assert_eq!(normalize_path("/api/search/x%252F..%252F.."), "/api");
        let climbing = routes("/api/search/x%252F..%252F..");
        assert!(!climbing.is_empty());
        assert!(climbing.iter().all(|r| r.starts_with("/api/search/")));
    }

    #[test]
    fn folded_values_meet_every_case_insensitive_reading() {
        for spelling in [" Alice@X.com", "AL\u{130}CE@x.com", "al\u{131}ce@x.com"] {
            assert_eq!(folded(spelling), "alice@x.com", "{spelling}");
        }
        assert_eq!(folded("\u{c9}MILE"), "emile");
    }

    #[test]
    fn compatibility_spellings_and_accents_are_plain_letters() {
        // Full-width, circled, bold, fraktur, double-struck; accents, and a
        // combining accent (NFD); a ligature; superscript digits.
        for spelling in [
            "\u{ff21}lice",
            "\u{24d0}lice",
            "\u{24b6}lice",
            "\u{1d41a}lice",
            "\u{1d51e}lice",
            "\u{1d552}lice",
            "\u{e1}lic\u{e9}",
            "a\u{301}lice\u{300}",
            "\u{100}LICE",
        ] {
            assert_eq!(folded(spelling), "alice", "{spelling}");
        }
        assert_eq!(folded("\u{fb01}ona"), "fiona");
        assert_eq!(folded("user\u{b9}\u{b2}\u{b3}"), "user123");
        assert_eq!(folded("\u{1d7ce}7"), "07");
        assert_eq!(folded("stra\u{df}e"), "strasse");
        assert_eq!(folded("\u{152}uvre"), "oeuvre");
        assert_eq!(folded("\u{17f}ki"), "ski");
        assert_eq!(folded("STRA\u{1e9e}E"), folded("stra\u{df}e"));
        assert_eq!(folded("\u{212b}ngstr\u{f6}m"), "angstrom");
        assert_eq!(
            folded("\u{39d}\u{399}\u{39a}\u{39f}\u{3a3}"),
            folded("\u{3bd}\u{3b9}\u{3ba}\u{3bf}\u{3c2}")
        );
        // What has no plain spelling stays as it is.
        assert_eq!(folded("\u{444}\u{d7}"), "\u{444}\u{d7}");
        assert_eq!(LATIN_BASES.len(), 0x180 - 0xC0);
    }

    #[test]
    fn cookies_lose_quotes_and_escapes() {
        for (raw, canonical) in [
            ("s3", "s3"),
            ("\"s3\"", "s3"),
            (" s3 ", "s3"),
            ("%73%33", "s3"),
            ("\"%73%33\"", "s3"),
            ("%22s3%22", "s3"),
            ("\"", "\""),
            ("a+b", "a b"),
            ("s3%00x", "s3"),
            ("\"s3%00\"", "s3"),
            // Python's cookie escapes, in a quoted value only.
            (r#""\163\063""#, "s3"),
            (r#""s\3""#, "s3"),
            (r#"%22s\3%22"#, "s3"),
            (r#""\477s\""#, "477s\\"),
            (r#"s\3"#, r#"s\3"#),
            (r#""s3\000x""#, "s3"),
        ] {
            assert_eq!(cookie_value(raw), canonical, "{raw}");
        }
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        assert_eq!(ip("203.0.113.9"), "203.0.113.9");
        assert_eq!(ip("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
        assert_eq!(ip("2001:0db8:0001:0002:ffff::1"), "2001:db8:1:2::/64");
        assert_eq!(ip("::ffff:203.0.113.9"), "203.0.113.9");
        assert_eq!(ip("not an ip"), "not an ip");
        assert_eq!(ip(""), "");
    }

    #[test]
    fn the_proxy_appended_address_is_the_last() {
        assert_eq!(last_forwarded("10.0.0.1"), "10.0.0.1");
        assert_eq!(last_forwarded("spoofed, 203.0.113.1"), "203.0.113.1");
        assert_eq!(last_forwarded("a,b , c "), "c");
    }
}
