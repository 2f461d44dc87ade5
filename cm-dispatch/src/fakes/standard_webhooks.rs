//! Standard Webhooks 1.0 signatures as the receivers in tests check them: the one verifier of
//! cm's test receivers (cm-dispatch's conformance receiver and the chaos run's), and a signer
//! for requests a test forges.
//!
//! Written from the specification's text with HMAC-SHA256 and base64, independently of the
//! `standardwebhooks` crate the webhook backend signs with, so a receiver checks the backend
//! instead of agreeing with it by construction. A signature is `v1,<base64>` of the HMAC-SHA256
//! of `<webhook-id>.<webhook-timestamp>.<body>` under the key a secret `whsec_<base64>` holds;
//! the `webhook-signature` header lists one or more, separated by spaces (several during a key
//! rotation). The timestamp's freshness is the receiver's to judge against its own clock.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit as _, Mac};
use sha2::Sha256;

/// The key of `secret` (`whsec_<base64>`), or `None` for a secret of another form or an empty
/// key.
fn key(secret: &str) -> Option<Vec<u8>> {
    secret
        .strip_prefix("whsec_")
        .and_then(|k| STANDARD.decode(k).ok())
        .filter(|k| !k.is_empty())
}

/// The HMAC of the signed content, `<id>.<timestamp>.<body>`, under `key`.
fn mac(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Some(mac)
}

/// Whether `header` (the `webhook-signature` value) holds a `v1` signature of `id`, `timestamp`
/// and `body` under `secret`. Any other version, a signature that is not base64, and a secret
/// that is not `whsec_<base64>` of a non-empty key verify nothing.
pub fn signature_valid(secret: &str, id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let Some(key) = key(secret) else {
        return false;
    };
    header.split(' ').any(|candidate| {
        let Some(signature) = candidate
            .strip_prefix("v1,")
            .and_then(|encoded| STANDARD.decode(encoded).ok())
        else {
            return false;
        };
        // `verify_slice` compares in constant time, as a receiver should.
        mac(&key, id, timestamp, body).is_some_and(|mac| mac.verify_slice(&signature).is_ok())
    })
}

/// The `v1,<base64>` signature of `id`, `timestamp` and `body` under `secret`, for a test that
/// sends a request itself; `None` for a secret that is not `whsec_<base64>` of a non-empty key.
pub fn sign(secret: &str, id: &str, timestamp: &str, body: &[u8]) -> Option<String> {
    let mac = mac(&key(secret)?, id, timestamp, body)?;
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (and of every library that follows it).
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: &str = "1614265330";
    const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn valid(secret: &str, id: &str, timestamp: &str, body: &str, header: &str) -> bool {
        signature_valid(secret, id, timestamp, body.as_bytes(), header)
    }

    #[test]
    fn the_specifications_example_is_signed_and_verified() {
        assert_eq!(
            sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY.as_bytes()).as_deref(),
            Some(SPEC_SIGNATURE)
        );
        assert!(valid(
            SPEC_SECRET,
            SPEC_ID,
            SPEC_TIMESTAMP,
            SPEC_BODY,
            SPEC_SIGNATURE
        ));
        // Among other signatures, as during a key rotation.
        let rotated = format!("v1,bm90IGl0 {SPEC_SIGNATURE} v2,abc");
        assert!(valid(
            SPEC_SECRET,
            SPEC_ID,
            SPEC_TIMESTAMP,
            SPEC_BODY,
            &rotated
        ));
    }

    #[test]
    fn nothing_altered_verifies() {
        // Each part of the signed content matters, and so do the key and the version.
        for (id, timestamp, body) in [
            ("msg_other", SPEC_TIMESTAMP, SPEC_BODY),
            (SPEC_ID, "1614265331", SPEC_BODY),
            (SPEC_ID, SPEC_TIMESTAMP, r#"{"test": 2432232315}"#),
        ] {
            assert!(!valid(SPEC_SECRET, id, timestamp, body, SPEC_SIGNATURE));
        }
        let other = "whsec_b3RoZXIta2V5LW9mLXRoZS10ZXN0";
        assert!(!valid(
            other,
            SPEC_ID,
            SPEC_TIMESTAMP,
            SPEC_BODY,
            SPEC_SIGNATURE
        ));
        let v2 = SPEC_SIGNATURE.replacen("v1,", "v2,", 1);
        assert!(!valid(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY, &v2));
        for bad in [
            "",
            "v1,",
            "v1,not base64!",
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ] {
            assert!(!valid(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY, bad));
        }
        for bad_secret in ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_!!"] {
            assert!(!valid(
                bad_secret,
                SPEC_ID,
                SPEC_TIMESTAMP,
                SPEC_BODY,
                SPEC_SIGNATURE
            ));
            assert_eq!(sign(bad_secret, SPEC_ID, SPEC_TIMESTAMP, b"{}"), None);
        }
    }
}
