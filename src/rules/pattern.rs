//! A rule's `path` pattern: `*` is any run of characters within one
//! segment, `**` any run at all. Compiled once, with the configuration, into
//! bit masks that read a path a byte at a time with a few word operations
//! (shift-and), so a long path from a client costs no more than reading it.

/// A compiled path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    /// Tokens in the pattern: a byte, `*` or `**` each.
    tokens: usize,
    /// 64-bit words per set of states (states 0 to `tokens`).
    words: usize,
    /// For each byte, the states at a token that is that byte.
    bytes: Vec<u64>,
    /// The states at a `*`, and at a `**`.
    star: Vec<u64>,
    stars: Vec<u64>,
}

impl PathPattern {
    /// The pattern `text` compiled.
    pub fn new(text: &str) -> PathPattern {
        let p = text.as_bytes();
        // At most one token per byte.
        let words = (p.len() + 1).div_ceil(64);
        let mut pattern = PathPattern {
            text: text.to_owned(),
            tokens: 0,
            words,
            bytes: vec![0; 256 * words],
            star: vec![0; words],
            stars: vec![0; words],
        };
        let mut i = 0;
        while i < p.len() {
            let (word, bit) = (pattern.tokens / 64, 1u64 << (pattern.tokens % 64));
            match (p[i], p.get(i + 1)) {
                (b'*', Some(b'*')) => {
                    pattern.stars[word] |= bit;
                    i += 1;
                }
                (b'*', _) => pattern.star[word] |= bit,
                (b, _) => pattern.bytes[usize::from(b) * words + word] |= bit,
            }
            i += 1;
            pattern.tokens += 1;
        }
        pattern
    }

    /// Whether a (canonical) path lies below `prefix` (`/api` takes `/api`
    /// and `/api/x`, not `/apiary`) and fits `pattern`, if there is one.
    pub fn within(prefix: &str, pattern: Option<&PathPattern>, path: &str) -> bool {
        let prefix = prefix.trim_end_matches('/');
        let below_prefix = prefix.is_empty()
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        below_prefix && pattern.is_none_or(|p| p.matches(path))
    }

    /// The pattern as configured.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `path` matches the whole pattern. Reads each byte once, and
    /// stops as soon as no state is left, or when the pattern ends in `**`
    /// and has reached it.
    pub fn matches(&self, path: &str) -> bool {
        if self.words == 1 {
            return self.matches_in_a_word(path.as_bytes());
        }
        let w = self.words;
        let mut live = vec![0u64; w];
        let mut next = vec![0u64; w];
        live[0] = 1;
        self.close(&mut live);
        for &c in path.as_bytes() {
            let at = &self.bytes[usize::from(c) * w..][..w];
            let mut carry = 0;
            for i in 0..w {
                let moved = live[i] & at[i];
                next[i] = moved << 1 | carry;
                carry = moved >> 63;
                next[i] |= live[i] & self.stars[i];
                if c != b'/' {
                    next[i] |= live[i] & self.star[i];
                }
            }
            self.close(&mut next);
            std::mem::swap(&mut live, &mut next);
            if live.iter().all(|&word| word == 0) {
                return false;
            }
        }
        let end = self.tokens;
        live[end / 64] >> (end % 64) & 1 == 1
    }

    /// [`PathPattern::matches`] for a pattern of fewer than 64 tokens, the
    /// states in one word.
    fn matches_in_a_word(&self, path: &[u8]) -> bool {
        let (star, stars, end) = (self.star[0], self.stars[0], 1u64 << self.tokens);
        let past = |mut states: u64| loop {
            let more = states | (states & (star | stars)) << 1;
            if more == states {
                return states;
            }
            states = more;
        };
        // A `**` at the end takes whatever follows once it is reached.
        let open_end = stars & end >> 1 != 0;
        let mut live = past(1);
        for &c in path {
            if live == 0 || open_end && live & end != 0 {
                break;
            }
            let mut next = (live & self.bytes[usize::from(c)]) << 1 | live & stars;
            if c != b'/' {
                next |= live & star;
            }
            live = past(next);
        }
        live & end != 0
    }

    /// Adds to `states` those a `*` or `**` reaches without reading: past it.
    fn close(&self, states: &mut [u64]) {
        loop {
            let mut carry = 0;
            let mut grew = false;
            for (word, (star, stars)) in states.iter_mut().zip(self.star.iter().zip(&self.stars)) {
                let past = *word & (star | stars);
                let added = (past << 1 | carry) & !*word;
                carry = past >> 63;
                *word |= added;
                grew |= added != 0;
            }
            if !grew {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, path: &str) -> bool {
        PathPattern::new(pattern).matches(path)
    }

    #[test]
    fn stars_stay_within_a_segment_and_double_stars_do_not() {
        for (pattern, path, expected) in [
            ("/api/*/items", "/api/v1/items", true),
            ("/api/*/items", "/api/v1/v2/items", false),
            ("/api/**/items", "/api/v1/v2/items", true),
            ("/api/**", "/api", false),
            ("/api/**", "/api/", true),
            ("/**.json", "/a/b.json", true),
            ("/**.json", "/a/b.xml", false),
            ("/*", "/", true),
            ("/v/0*", "/v/012", true),
            ("/a**b", "/ab", true),
            ("/a*", "/a/", false),
            ("/***", "/a/b", true),
            ("/x", "/x/", false),
        ] {
            assert_eq!(matches(pattern, path), expected, "{pattern} {path}");
        }
    }

    #[test]
    fn patterns_stay_linear_on_long_paths() {
        let long = format!("/{}", "a/".repeat(20_000));
        assert!(!matches("/**b**b**b**b", &long));
        assert!(matches("/**", &long));
        assert!(!matches("/*", &long));
    }

    #[test]
    fn a_pattern_of_more_than_64_tokens_spans_words() {
        let segment = "abcdefghij/".repeat(15);
        let pattern = format!("/{segment}*/**/z");
        assert!(PathPattern::new(&pattern).tokens > 128);
        assert!(matches(&pattern, &format!("/{segment}x/y/z")));
        assert!(!matches(&pattern, &format!("/{segment}x/y/w")));
        assert!(!matches(
            &pattern,
            &format!("/{}x/y/z", "abcdefghij/".repeat(14))
        ));
    }
}
