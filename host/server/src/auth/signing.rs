//! Signed policy components: the ed25519 keys a site trusts (`policy_signing_keys`), checking
//! an upload's `Sluice-Signature`, and making keys and signatures for the CLI.
//!
//! A signature's text is `keyid=ID,sig=BASE64` (the 64-byte ed25519 signature of the
//! component's bytes, standard base64): the header's value, and a detached `.sig` file's
//! whole content. A key file holds `id=ID` and `secret=BASE64` (the 32-byte seed) on two lines.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand::RngCore;
use std::collections::BTreeMap;

pub use sluice_wire::SIGNATURE_HEADER;
const MAX_KEY_ID_BYTES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("this server takes only signed policy components: send a `Sluice-Signature` header")]
    Missing,
    #[error("the signature is malformed: {0}")]
    Malformed(String),
    #[error("no trusted signing key has the id `{0}`")]
    UnknownKey(String),
    #[error("the signature does not match the component's bytes under key `{0}`")]
    Mismatch(String),
    #[error("invalid signing key: {0}")]
    BadKey(String),
}

/// One trusted key as the config file gives it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub id: String,
    /// The 32-byte ed25519 public key, standard base64.
    pub public_key: String,
}

/// The trusted keys, by id. Empty: uploads need no signature.
#[derive(Clone, Debug, Default)]
pub struct SigningKeys {
    keys: BTreeMap<String, VerifyingKey>,
}

fn check_key_id(id: &str) -> Result<(), SignatureError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if id.is_empty() || id.len() > MAX_KEY_ID_BYTES || !id.chars().all(allowed) {
        return Err(SignatureError::BadKey(format!(
            "a key id is 1 to {MAX_KEY_ID_BYTES} ASCII letters, digits, `.`, `_` or `-`"
        )));
    }
    Ok(())
}

fn decode_exact<const N: usize>(text: &str, what: &str) -> Result<[u8; N], String> {
    let bytes = BASE64
        .decode(text.trim())
        .map_err(|e| format!("{what} is not base64: {e}"))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("{what} is {} bytes, not {N}", b.len()))
}

impl SigningKeys {
    pub fn new(configs: &[KeyConfig]) -> Result<SigningKeys, SignatureError> {
        let mut keys = BTreeMap::new();
        for config in configs {
            check_key_id(&config.id)?;
            let bytes = decode_exact::<32>(&config.public_key, "public_key")
                .map_err(SignatureError::BadKey)?;
            let key = VerifyingKey::from_bytes(&bytes)
                .map_err(|e| SignatureError::BadKey(format!("{}: {e}", config.id)))?;
            if keys.insert(config.id.clone(), key).is_some() {
                return Err(SignatureError::BadKey(format!(
                    "the key id `{}` is given twice",
                    config.id
                )));
            }
        }
        Ok(SigningKeys { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks `signature` (the header's text) over `module`: the id of the key that signed
    /// it, or `None` when no keys are configured (then any signature is ignored).
    pub fn verify(
        &self,
        module: &[u8],
        signature: Option<&str>,
    ) -> Result<Option<String>, SignatureError> {
        if self.keys.is_empty() {
            return Ok(None);
        }
        let (key_id, signature) = parse_signature(signature.ok_or(SignatureError::Missing)?)?;
        let key = self
            .keys
            .get(&key_id)
            .ok_or_else(|| SignatureError::UnknownKey(key_id.clone()))?;
        key.verify_strict(module, &signature)
            .map_err(|_| SignatureError::Mismatch(key_id.clone()))?;
        Ok(Some(key_id))
    }
}

/// `keyid=ID,sig=BASE64`, in either order, spaces around the parts allowed.
pub fn parse_signature(text: &str) -> Result<(String, Signature), SignatureError> {
    let malformed = |reason: &str| SignatureError::Malformed(reason.to_owned());
    let (mut key_id, mut sig) = (None, None);
    for part in text.trim().split(',') {
        let (name, value) = part
            .trim()
            .split_once('=')
            .ok_or_else(|| malformed("expected keyid=ID,sig=BASE64"))?;
        match name.trim() {
            "keyid" => key_id = Some(value.trim().to_owned()),
            // base64 ends in `=`: split_once took only the first.
            "sig" => sig = Some(value.trim().to_owned()),
            other => return Err(malformed(&format!("unknown part `{other}`"))),
        }
    }
    let key_id = key_id.ok_or_else(|| malformed("no keyid"))?;
    check_key_id(&key_id).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    let bytes = decode_exact::<64>(&sig.ok_or_else(|| malformed("no sig"))?, "sig")
        .map_err(SignatureError::Malformed)?;
    Ok((key_id, Signature::from_bytes(&bytes)))
}

/// A new key pair: the key file's text and the public key (base64) for the config.
pub fn generate(key_id: &str) -> Result<(String, String), SignatureError> {
    check_key_id(key_id)?;
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    let key = SigningKey::from_bytes(&seed);
    let file = format!("id={key_id}\nsecret={}\n", BASE64.encode(seed));
    Ok((file, BASE64.encode(key.verifying_key().to_bytes())))
}

/// Signs `module` with the key file's key: the signature's text.
pub fn sign(key_file: &str, module: &[u8]) -> Result<String, SignatureError> {
    let bad = |reason: &str| SignatureError::BadKey(reason.to_owned());
    let (mut key_id, mut secret) = (None, None);
    for line in key_file.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.split_once('=') {
            Some(("id", value)) => key_id = Some(value.trim()),
            Some(("secret", value)) => secret = Some(value.trim()),
            _ => return Err(bad("a key file has `id=` and `secret=` lines only")),
        }
    }
    let key_id = key_id.ok_or_else(|| bad("the key file has no `id=` line"))?;
    check_key_id(key_id)?;
    let seed = decode_exact::<32>(
        secret.ok_or_else(|| bad("the key file has no `secret=` line"))?,
        "secret",
    )
    .map_err(SignatureError::BadKey)?;
    let signature = SigningKey::from_bytes(&seed).sign(module);
    Ok(format!(
        "keyid={key_id},sig={}",
        BASE64.encode(signature.to_bytes())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(id: &str, public_key: String) -> SigningKeys {
        SigningKeys::new(&[KeyConfig {
            id: id.into(),
            public_key,
        }])
        .unwrap()
    }

    #[test]
    fn a_signature_verifies_and_any_flipped_byte_is_refused() {
        let (key_file, public_key) = generate("ops-1").unwrap();
        let keys = trusted("ops-1", public_key);
        let module = b"\0asm component bytes".to_vec();
        let signature = sign(&key_file, &module).unwrap();
        assert_eq!(
            keys.verify(&module, Some(&signature)),
            Ok(Some("ops-1".into()))
        );
        let mut flipped = module.clone();
        flipped[3] ^= 1;
        assert_eq!(
            keys.verify(&flipped, Some(&signature)),
            Err(SignatureError::Mismatch("ops-1".into()))
        );
        let (_, sig) = parse_signature(&signature).unwrap();
        let mut bytes = sig.to_bytes();
        bytes[10] ^= 0x40;
        let forged = format!("keyid=ops-1,sig={}", BASE64.encode(bytes));
        assert!(keys.verify(&module, Some(&forged)).is_err());
        assert_eq!(keys.verify(&module, None), Err(SignatureError::Missing));
    }

    #[test]
    fn an_unknown_key_and_a_malformed_header_are_refused() {
        let (_, public_key) = generate("ops-1").unwrap();
        let (other_file, _) = generate("ops-2").unwrap();
        let keys = trusted("ops-1", public_key);
        let module = b"bytes".to_vec();
        let by_other = sign(&other_file, &module).unwrap();
        assert_eq!(
            keys.verify(&module, Some(&by_other)),
            Err(SignatureError::UnknownKey("ops-2".into()))
        );
        for text in [
            "",
            "keyid=ops-1",
            "sig=AAAA",
            "keyid=ops-1,sig=!!",
            "x=1,keyid=a,sig=b",
        ] {
            assert!(
                matches!(
                    keys.verify(&module, Some(text)),
                    Err(SignatureError::Malformed(_))
                ),
                "{text:?}"
            );
        }
    }

    #[test]
    fn without_keys_nothing_is_checked_and_bad_keys_are_refused_at_start() {
        assert_eq!(SigningKeys::default().verify(b"x", None), Ok(None));
        let bad = |id: &str, key: &str| {
            SigningKeys::new(&[KeyConfig {
                id: id.into(),
                public_key: key.into(),
            }])
        };
        assert!(bad("ops-1", "not base64!").is_err());
        assert!(bad("ops-1", &BASE64.encode([1u8; 31])).is_err());
        assert!(bad("bad id", &BASE64.encode([1u8; 32])).is_err());
    }
}
