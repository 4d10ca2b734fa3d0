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
}
