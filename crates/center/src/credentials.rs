//! Users' credentials: passwords kept as salted, slow Argon2id hashes (the PHC string
//! holds the salt and parameters), API tokens as random secrets kept as their SHA-256
//! (a token is 256 random bits: a fast hash is enough, and lets a call find its token by
//! an index).

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

/// Fewer characters than this are refused as a password.
pub const MIN_PASSWORD_CHARS: usize = 10;

/// What every token's secret starts with: a secret scanner (and a reader) can tell one.
pub const TOKEN_PREFIX: &str = "sluice_";

/// A password's PHC string (Argon2id with the crate's default cost: 19 MiB, two passes),
/// or why the password is refused.
pub fn hash_password(password: &str) -> Result<String, String> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(format!(
            "a password needs at least {MIN_PASSWORD_CHARS} characters"
        ));
    }
    let salt = SaltString::encode_b64(&random::<16>()).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// Whether `password` is the one `hash` was made of (in a time that does not depend on
/// where they differ). A stored hash that cannot be read matches nothing.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| {
        Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// A new API token: the secret to hand out once, and the digest to keep.
pub fn new_token() -> (String, [u8; 32]) {
    let secret = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<32>())
    );
    let digest = token_digest(&secret);
    (secret, digest)
}

/// What the meta database keeps of a token's secret.
pub fn token_digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether `name` can name a user: 1–64 letters, digits, `.`, `_`, `-` or `@`.
pub fn check_user_name(name: &str) -> Result<(), String> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@');
    if (1..=64).contains(&name.len()) && name.chars().all(fine) {
        Ok(())
    } else {
        Err(format!(
            "`{name}` cannot name a user: 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
        ))
    }
}

/// Whether a given secret equals a configured one, in a time that does not depend on
/// where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source answers");
    bytes
}

/// The user a client certificate (DER) acts as: its subject's common name (CN). The
/// error says why it names none.
pub fn certificate_user(der: &[u8]) -> Result<String, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the client certificate cannot be read: {e}"))?;
    let cn = cert.subject().iter_common_name().next().ok_or_else(|| {
        format!(
            "the client certificate's subject ({}) has no CN",
            cert.subject()
        )
    })?;
    let name = cn
        .as_str()
        .map_err(|e| format!("the client certificate's CN is not text: {e}"))?;
    check_user_name(name).map_err(|e| format!("the client certificate's CN `{name}`: {e}"))?;
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_matches_its_own_salted_hash_only() {
        let hash = hash_password("correct horse battery").unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(!hash.contains("correct horse"));
        assert!(verify_password("correct horse battery", &hash));
        assert!(!verify_password("correct horse batterY", &hash));
        assert!(!verify_password("correct horse battery", "not a hash"));
        let again = hash_password("correct horse battery").unwrap();
        assert_ne!(hash, again, "each hash has its own salt");
    }

    #[test]
    fn a_short_password_is_refused_with_the_rule() {
        let e = hash_password("short").unwrap_err();
        assert!(e.contains("at least 10 characters"), "{e}");
    }

    #[test]
    fn tokens_are_random_and_kept_as_their_digest() {
        let (a, digest) = new_token();
        let (b, _) = new_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() > 40, "{a}");
        assert_eq!(token_digest(&a), digest);
        assert_ne!(token_digest(&b), digest);
    }

    #[test]
    fn secrets_match_only_when_equal_in_full() {
        assert!(constant_time_eq(b"s3cret-token", b"s3cret-token"));
        assert!(!constant_time_eq(b"s3cret-token", b"s3cret-tokeN"));
        assert!(
            !constant_time_eq(b"s3cret", b"s3cret-token"),
            "a prefix is not the token"
        );
        assert!(!constant_time_eq(b"", b"s3cret-token"));
    }

    #[test]
    fn user_names_are_plain() {
        assert!(check_user_name("ops.jane@example").is_ok());
        for bad in ["", "<script>", "a b", &"x".repeat(65)] {
            assert!(check_user_name(bad).is_err(), "{bad}");
        }
    }

    /// Self-signed test certificates (made with openssl, valid for a century): subjects
    /// `O=Sluice tests, CN=alice` and `O=Sluice tests` (no CN).
    const ALICE: &str = "MIIBpTCCAUugAwIBAgIUCfqYWnK5hV65XO982UOqFWOjWgcwCgYIKoZIzj0EAwIwJzEVMBMGA1UECgwMU2x1aWNlIHRlc3RzMQ4wDAYDVQQDDAVhbGljZTAgFw0yNjExMjgxMDUyNTBaGA8yMTI2MTEwNDEwNTI1MFowJzEVMBMGA1UECgwMU2x1aWNlIHRlc3RzMQ4wDAYDVQQDDAVhbGljZTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABDz9MOk7USpPEE52X8AYJxV0iJraONRq2xSzuuJhJpGgxdws7PsQV1B7wUNAuLRDeyUMtJrwPeOdO3b1BUmN3fqjUzBRMB0GA1UdDgQWBBQ0Tvvxh86hPndxkBMHFL8JO1pskzAfBgNVHSMEGDAWgBQ0Tvvxh86hPndxkBMHFL8JO1pskzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIErJI2ZnD4R+Pw2c7ftYQanbZl5z8IJ+bBUU8RwCLkD9AiEAk7Qo5ug/zlrdjabNt3165lPyKF2OorcftsEn1roHN30=";
    const NO_CN: &str = "MIIBhTCCASugAwIBAgIUBW59mBEQWZy06M68CbsVkP29gn8wCgYIKoZIzj0EAwIwFzEVMBMGA1UECgwMU2x1aWNlIHRlc3RzMCAXDTI2MTEyODEwNTI1MFoYDzIxMjYxMTA0MTA1MjUwWjAXMRUwEwYDVQQKDAxTbHVpY2UgdGVzdHMwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATren5/rQEbNAr/b97a9T9TgRYyimMN+fcVQrDdctmtp22BVbal+yyW+Hxaqu84ZqfSBQZDXrc+KSslFeDM2M0ao1MwUTAdBgNVHQ4EFgQUAcY7CbcimugT8Fs1j3xWHNn1hcUwHwYDVR0jBBgwFoAUAcY7CbcimugT8Fs1j3xWHNn1hcUwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAhZC/Lv3L4gWoNj6JWOI7RGZVmvuFTlt5MlQs2Dkno+oCIGVw51nHyliCdxOIXX+2wReRIiKHuVDyvDKo9LjapABM";

    #[test]
    fn a_certificate_acts_as_the_user_its_cn_names() {
        use base64::Engine as _;
        let der = |b64: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap()
        };
        assert_eq!(certificate_user(&der(ALICE)), Ok("alice".to_owned()));
        let why = certificate_user(&der(NO_CN)).unwrap_err();
        assert!(why.contains("has no CN"), "{why}");
        assert!(certificate_user(b"not a certificate").is_err());
    }
}
