//! How the limiter names a client in its keys and its stats
//! (`stats_clients`): readable, hashed, or keyed by a secret. The stats
//! show the form the keys hold, so an operator reaches a client by it.

use sha1_smol::Sha1;

/// How a rule's keys, and the stats, show a client's identifier
/// (`stats_clients`): the form an operator sees is the key's own, so that
/// `limit` and `inspect` reach a client by it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClientForm {
    /// Plain where it can be, else hashed (`keys::redis_key`).
    #[default]
    Readable,
    /// `#` and the SHA1 of the parts, always: no address kept readable,
    /// though anyone can hash every IPv4 address to find one.
    Hashed,
    /// `~` and the HMAC-SHA1 of the parts under a secret: found again only
    /// by whoever holds the secret.
    Keyed(HmacKey),
    /// The one part given is already the identifier as a key shows it: what
    /// an operator copied from the stats (`keys::shown_form` checks it). Never
    /// read from configuration.
    Shown,
}

/// `h` fed `parts`, each after its length, so that no two lists of parts
/// feed the same bytes.
pub fn length_prefixed<S: AsRef<str>>(mut h: Sha1, parts: &[S]) -> Sha1 {
    for p in parts {
        let p = p.as_ref();
        h.update(&(p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h
}

/// HMAC-SHA1 (RFC 2104) under one secret, its two padded-key states worked
/// out once. SHA1's collisions do not weaken HMAC as a keyed function.
#[derive(Clone, PartialEq, Eq)]
pub struct HmacKey {
    inner: Sha1,
    outer: Sha1,
}

impl std::fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret, nor what it derives.
        f.write_str("HmacKey(..)")
    }
}

impl HmacKey {
    /// The key for `secret`.
    pub fn new(secret: &[u8]) -> HmacKey {
        let mut block = [0u8; 64];
        if secret.len() > block.len() {
            block[..20].copy_from_slice(&Sha1::from(secret).digest().bytes());
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        // A byte at a time: once per isolate, and smaller in the wasm.
        let (mut inner, mut outer) = (Sha1::new(), Sha1::new());
        for b in block {
            inner.update(&[b ^ 0x36]);
            outer.update(&[b ^ 0x5c]);
        }
        HmacKey { inner, outer }
    }

    /// The MAC of what `inner` was fed after the key.
    fn finish(&self, inner: Sha1) -> sha1_smol::Digest {
        let mut outer = self.outer.clone();
        outer.update(&inner.digest().bytes());
        outer.digest()
    }

    /// The MAC of `parts`, each after its length (hex as it displays).
    pub fn mac(&self, parts: &[&str]) -> sha1_smol::Digest {
        let inner = length_prefixed(self.inner.clone(), parts);
        self.finish(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 2202's HMAC-SHA1 cases 1, 2 and 6 (a key longer than a block).
    #[test]
    fn hmac_sha1_meets_rfc_2202() {
        let mac = |key: &[u8], message: &[u8]| {
            let k = HmacKey::new(key);
            let mut inner = k.inner.clone();
            inner.update(message);
            k.finish(inner).to_string()
        };
        assert_eq!(
            mac(&[0x0b; 20], b"Hi There"),
            "b617318655057264e28bc0b6fb378c8ef146be00"
        );
        assert_eq!(
            mac(b"Jefe", b"what do ya want for nothing?"),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            mac(
                &[0xaa; 80],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
    }
}
