//! PURE: `X-Hub-Signature-256` over the exact bytes Meta sent.
//!
//! The HMAC is checked on the raw body, never on re-serialised JSON: Meta's wire format escapes
//! every non-ASCII character and every `/`, so a body that was parsed and written again no longer
//! matches. Comparison is constant-time (`Mac::verify_slice`). Several secrets may be accepted at
//! once so that an app secret can be rotated without refusing deliveries.

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a delivery was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the X-Hub-Signature-256 header is missing")]
    Missing,
    #[error("the X-Hub-Signature-256 header is not sha256=<64 hex digits>")]
    Malformed,
    #[error("the X-Hub-Signature-256 header does not match the body")]
    Mismatch,
}

/// Checks `header` (the header's value, if any) against `body` with any of `secrets`.
///
/// # Errors
/// A [`Rejection`] saying what was wrong with the header.
pub fn verify(
    secrets: &[SecretString],
    header: Option<&[u8]>,
    body: &[u8],
) -> Result<(), Rejection> {
    let header = header.ok_or(Rejection::Missing)?;
    let hex_digest = header
        .strip_prefix(b"sha256=")
        .ok_or(Rejection::Malformed)?;
    if hex_digest.len() != 64 {
        return Err(Rejection::Malformed);
    }
    // `hex` accepts upper and lower case alike.
    let digest = hex::decode(hex_digest).map_err(|_| Rejection::Malformed)?;
    let matched = secrets.iter().any(|secret| {
        let mut mac = mac(secret);
        mac.update(body);
        mac.verify_slice(&digest).is_ok()
    });
    if matched {
        Ok(())
    } else {
        Err(Rejection::Mismatch)
    }
}

/// The header value Meta would send for `body`: used by `sabi send` and the tests.
pub fn sign(secret: &SecretString, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn mac(secret: &SecretString) -> HmacSha256 {
    // HMAC takes keys of any length, so this cannot fail.
    HmacSha256::new_from_slice(secret.expose_secret().as_bytes())
        .expect("HMAC accepts any key length")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    /// The vectors of the reference: the escaped and the raw UTF-8 body of one JSON value.
    const VECTORS: &[(&str, &str)] = &[
        (
            r#"{"object":"whatsapp_business_account","entry":[]}"#,
            "sha256=c84a394cc475525991e78ff16e430b02e47f953877d2af0ade26956ce6f384dc",
        ),
        (
            r#"{"text":{"body":"caf\u00e9 \ud83d\ude00 a\/b"}}"#,
            "sha256=991a6c39af9501d4a32d5fa3c459a249d08c47a34a13cf7aa41677b5b923fed5",
        ),
        (
            r#"{"text":{"body":"café 😀 a/b"}}"#,
            "sha256=48ccd2297f056bdabfe340b9ea53857a8982a84bf883bab3305878a31ccb8f43",
        ),
    ];

    #[test]
    fn reference_vectors_verify() {
        let secrets = [secret("test-app-secret")];
        for (body, sig) in VECTORS {
            assert_eq!(sign(&secrets[0], body.as_bytes()), *sig);
            assert_eq!(
                verify(&secrets, Some(sig.as_bytes()), body.as_bytes()),
                Ok(())
            );
            let upper = format!("sha256={}", sig[7..].to_uppercase());
            assert_eq!(
                verify(&secrets, Some(upper.as_bytes()), body.as_bytes()),
                Ok(())
            );
        }
    }

    #[test]
    fn escaped_and_raw_forms_do_not_share_a_signature() {
        let secrets = [secret("test-app-secret")];
        let (escaped, _) = VECTORS[1];
        let (_, raw_sig) = VECTORS[2];
        assert_eq!(
            verify(&secrets, Some(raw_sig.as_bytes()), escaped.as_bytes()),
            Err(Rejection::Mismatch)
        );
    }

    #[test]
    fn bad_headers_are_refused() {
        let secrets = [secret("s")];
        let body = b"{}";
        let good = sign(&secrets[0], body);
        let cases: Vec<(Option<String>, Rejection)> = vec![
            (None, Rejection::Missing),
            (Some(String::new()), Rejection::Malformed),
            (Some(good.replace("sha256=", "sha1=")), Rejection::Malformed),
            (Some(good.replace("sha256=", "")), Rejection::Malformed),
            (Some(format!("{good}00")), Rejection::Malformed),
            (
                Some(format!("sha256={}", "z".repeat(64))),
                Rejection::Malformed,
            ),
            (Some(sign(&secret("other"), body)), Rejection::Mismatch),
        ];
        for (header, want) in cases {
            assert_eq!(
                verify(&secrets, header.as_deref().map(str::as_bytes), body),
                Err(want),
                "{header:?}"
            );
        }
    }

    #[test]
    fn one_altered_byte_fails() {
        let secrets = [secret("s")];
        let body = br#"{"object":"whatsapp_business_account","entry":[]}"#.to_vec();
        let sig = sign(&secrets[0], &body);
        for i in 0..body.len() {
            let mut altered = body.clone();
            altered[i] ^= 1;
            assert_eq!(
                verify(&secrets, Some(sig.as_bytes()), &altered),
                Err(Rejection::Mismatch)
            );
        }
    }

    #[test]
    fn any_configured_secret_is_accepted_during_rotation() {
        let secrets = [secret("new"), secret("old")];
        let body = b"{}";
        let sig = sign(&secret("old"), body);
        assert_eq!(verify(&secrets, Some(sig.as_bytes()), body), Ok(()));
    }
}
