//! Every Redis key the limiter names: a client's state key on a rule, built
//! so that no identifier can reach another rule's or client's key, and the
//! penalty and override keys beside it.

use sha1_smol::Sha1;

use crate::rules::{
    client_form::{length_prefixed, ClientForm},
    rule::Rule,
};

/// Longest identifier kept readable in the key; longer ones are hashed, so a
/// client cannot make Redis store arbitrarily long keys.
pub const MAX_PLAIN_ID: usize = 64;

/// Builds `el:{<identifier>}:<rule>`.
///
/// The braces are a Redis Cluster hash tag holding only the client's
/// identifier, so every rule keyed on the same identifier lands in the same
/// slot and one script call can decide them together. Identifier parts made
/// only of characters that cannot end a tag or separate parts
/// (`A-Z a-z 0-9 . _ : @ / -`) are kept as they are, joined by `|`; anything
/// else, or anything longer than [`MAX_PLAIN_ID`], becomes `#` and the SHA1
/// of the parts, each length-prefixed. Plain forms never contain `#`, `|` or
/// `}` inside a part, so the two forms cannot collide, and rule names (no
/// `}`) cannot reach into the tag.
pub fn redis_key(rule: &str, parts: &[&str]) -> String {
    state_key(&ClientForm::Readable, rule, parts)
}

/// The prefix of an identifier in [`ClientForm::Keyed`] form: not a plain
/// character, so no plain identifier can be one.
pub const KEYED_PREFIX: char = '~';

/// The state key of the client with identifier `parts` on `rule`, in the
/// form its configuration names clients in.
pub fn rule_key(rule: &Rule, parts: &[&str]) -> String {
    state_key(&rule.form, &rule.name, parts)
}

/// The state key of the client with identifier `parts` on `rule`, in `form`.
pub fn state_key(form: &ClientForm, rule: &str, parts: &[&str]) -> String {
    let plain_len: usize = parts.iter().map(|p| p.len() + 1).sum();
    // An empty tag `{}` would not be a hash tag at all, so empty is hashed too.
    let plain = plain_len > parts.len()
        && plain_len <= MAX_PLAIN_ID + parts.len()
        && parts.iter().all(|p| p.bytes().all(is_plain));
    let digest = match form {
        ClientForm::Readable if plain => None,
        ClientForm::Readable | ClientForm::Hashed => {
            Some(('#', length_prefixed(Sha1::new(), parts).digest()))
        }
        ClientForm::Keyed(key) => Some((KEYED_PREFIX, key.mac(parts))),
        // Its one part, as `shown_form` checked it.
        ClientForm::Shown => None,
    };
    match digest {
        Some((prefix, digest)) => format!("el:{{{prefix}{digest}}}:{rule}"),
        None => format!("el:{{{}}}:{rule}", parts.join("|")),
    }
}

/// Whether `shown` is an identifier as a key in `form` shows it: for
/// [`ClientForm::Shown`], which puts it in a key as it is.
pub fn shown_form(form: &ClientForm, shown: &str) -> bool {
    let digest = |prefix: char| {
        shown.strip_prefix(prefix).is_some_and(|hex| {
            hex.len() == 40 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
    };
    match form {
        ClientForm::Readable => {
            digest('#')
                || (!shown.is_empty()
                    && shown.len() <= MAX_PLAIN_ID + shown.matches('|').count()
                    && shown
                        .split('|')
                        .all(|p| !p.is_empty() && p.bytes().all(is_plain)))
        }
        ClientForm::Hashed => digest('#'),
        ClientForm::Keyed(_) => digest(KEYED_PREFIX),
        ClientForm::Shown => false,
    }
}

/// The client's identifier as a state key `el:{<identifier>}:<rule>`
/// shows it (plain, or hashed); `None` for text that is no such key.
pub fn client_in(key: &str) -> Option<&str> {
    let (_, tagged) = key.split_once('{')?;
    // Neither form holds `}`, and rule names hold none either.
    tagged.split_once('}').map(|(id, _)| id)
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'/' | b'-')
}

/// A stable offset in `[0, span_ms)` derived from the key, so that windowed
/// rules' bucket edges differ between clients and they do not all roll over
/// at the same instant.
pub fn window_offset(key: &str, span_ms: u64) -> u64 {
    // FNV-1a: stable across builds and platforms; it only spreads offsets.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % span_ms.max(1)
}

/// The key of a client's running penalty on a rule: its state key and
/// `:p` (rule names hold no `:`, so no rule's key can be another's penalty).
pub fn penalty_key(state_key: &str) -> String {
    format!("{state_key}:p")
}

/// The key of the pool a region holds of a shared rule for a client: its
/// state key and `:pool`, in the region's Redis (the state itself is the
/// home's).
pub fn pool_key(state_key: &str) -> String {
    format!("{state_key}:pool")
}

/// The key of a client's override on a rule: its state key and `:o`.
pub fn override_key(state_key: &str) -> String {
    format!("{state_key}:o")
}

/// The key of a rule's override for every client. No client's key can be
/// it: theirs hold a `{` hash tag.
pub fn rule_wide_key(rule: &str) -> String {
    format!("el:rule:{rule}:o")
}

/// The index of `rule`'s clients' overrides that `limit` keeps: a sorted
/// set of their keys, each scored by when it expires (ms since the epoch;
/// `+inf` for never), so that listing them reads no other key and drops
/// the expired. Under a hash tag of its own, which no client's identifier
/// can be (a hashed one is `#` and 40 hex digits).
pub fn overrides_index_key(rule: &str) -> String {
    format!("el:{{#overrides}}:{rule}")
}

/// A `SCAN` pattern matching every client's [`override_key`] on `rule`.
pub fn client_overrides_pattern(rule: &str) -> String {
    format!("el:{{*}}:{rule}:o")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::client_form::HmacKey;

    #[test]
    fn each_form_keys_a_client_as_the_stats_show_it() {
        let keyed = ClientForm::Keyed(HmacKey::new(b"a secret of sixteen+"));
        let other = ClientForm::Keyed(HmacKey::new(b"another secret, 16+"));
        let ip = ["192.0.2.1"];
        assert_eq!(
            state_key(&ClientForm::Readable, "r", &ip),
            "el:{192.0.2.1}:r"
        );
        let hashed = state_key(&ClientForm::Hashed, "r", &ip);
        let mut h = Sha1::new();
        h.update(&9u64.to_be_bytes());
        h.update(b"192.0.2.1");
        assert_eq!(hashed, format!("el:{{#{}}}:r", h.digest()));
        let mac = state_key(&keyed, "r", &ip);
        assert!(
            !mac.contains("192.0.2.1") && mac.starts_with("el:{~"),
            "{mac}"
        );
        assert_ne!(mac, state_key(&other, "r", &ip), "the secret decides it");
        assert_ne!(
            mac,
            state_key(&keyed, "r", &["192.0.2.1", ""]),
            "parts count"
        );
        for form in [ClientForm::Readable, ClientForm::Hashed, keyed.clone()] {
            let key = state_key(&form, "r", &ip);
            let shown = client_in(&key).unwrap();
            assert!(shown_form(&form, shown), "{form:?}: {shown}");
            assert_eq!(state_key(&ClientForm::Shown, "r", &[shown]), key);
        }
        for wrong in ["", "a}b", "a b", "#12", "~zz", "{x"] {
            assert!(!shown_form(&ClientForm::Readable, wrong), "{wrong:?}");
            assert!(!shown_form(&keyed, wrong), "{wrong:?}");
        }
        assert!(!shown_form(&keyed, "192.0.2.1"), "a hmac form only");
    }

    #[test]
    fn plain_identifiers_stay_readable() {
        assert_eq!(
            redis_key("per-ip", &["203.0.113.7"]),
            "el:{203.0.113.7}:per-ip"
        );
        assert_eq!(
            redis_key("api", &["2001:db8::1", "key-1"]),
            "el:{2001:db8::1|key-1}:api"
        );
    }

    #[test]
    fn hostile_identifiers_are_hashed_inside_the_tag() {
        for id in [
            "a}b",
            "{x}",
            "a|b",
            "new\nline",
            "nul\0",
            "#abc",
            &"x".repeat(65),
        ] {
            let key = redis_key("r", &[id]);
            assert!(key.starts_with("el:{#") && key.ends_with("}:r"), "{key}");
            assert_eq!(
                key.matches('{').count() + key.matches('}').count(),
                2,
                "{key}"
            );
        }
    }

    #[test]
    fn joins_cannot_collide() {
        assert_ne!(redis_key("r", &["a|b", "c"]), redis_key("r", &["a", "b|c"]));
        assert_ne!(redis_key("r", &["a b", ""]), redis_key("r", &["a", " b"]));
        assert_ne!(redis_key("r", &["a"]), redis_key("r2", &["a"]));
        assert!(
            redis_key("r", &[""]).starts_with("el:{#"),
            "an empty tag is no hash tag"
        );
        assert_eq!(
            redis_key("r", &[&"x".repeat(64)]).len(),
            "el:{}:r".len() + 64
        );
    }

    #[test]
    fn a_key_names_its_client_and_the_hash_is_the_keys_own() {
        let plain = redis_key("api", &["2001:db8::1", "key-1"]);
        assert_eq!(client_in(&plain), Some("2001:db8::1|key-1"));
        let long = redis_key("api", &[&"x".repeat(65)]);
        let shown = client_in(&long).unwrap();
        assert!(shown.starts_with('#') && shown.len() == 41, "{shown}");
        let always = state_key(&ClientForm::Hashed, "api", &[&"x".repeat(65)]);
        assert_eq!(
            always, long,
            "the hash is the same whichever form hashed it"
        );
        // A plain one's hash, under stats_clients = "hash".
        let mut h = Sha1::new();
        for p in ["2001:db8::1", "key-1"] {
            h.update(&(p.len() as u64).to_be_bytes());
            h.update(p.as_bytes());
        }
        assert_eq!(
            state_key(&ClientForm::Hashed, "api", &["2001:db8::1", "key-1"]),
            format!("el:{{#{}}}:api", h.digest())
        );
        assert_eq!(client_in("el:rule:api:o"), None);
    }

    #[test]
    fn offsets_are_stable_and_in_range() {
        let a = window_offset("el:{1.2.3.4}:r", 60_000);
        assert_eq!(a, window_offset("el:{1.2.3.4}:r", 60_000));
        assert!(a < 60_000);
        assert_eq!(window_offset("x", 1), 0);
        assert_ne!(a, window_offset("el:{1.2.3.5}:r", 60_000));
    }
}
