//! When a connection may send its password, and keeping a hostile server's answers from
//! crashing the one that does.
//!
//! Over plain TCP, whatever the client sends for a password can be read or guessed by
//! whoever answers at the address: `mysql_native_password` and the fast path of
//! `caching_sha2_password` send a scramble of the server's nonce that an offline guess
//! confirms, and the full `caching_sha2_password` exchange encrypts the password with an
//! RSA key the server itself hands out. The server chooses which, and may switch plugins
//! in the middle of the handshake, so what it announced beforehand proves nothing. A
//! connection therefore sends a password only inside TLS whose certificate was checked,
//! or to a host the operator of the connecting service allowed plain connections to
//! (`source_plaintext_hosts`, a file source's or `[meta]`'s `allow_plaintext`); otherwise
//! it is refused before it opens, with those keys.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;

/// Why a connection as `who` must not be opened, if so: neither TLS nor the operator's
/// leave to connect without it (`allow_key` names the setting that would give it).
pub fn refusal(tls: bool, allow_plaintext: bool, who: &str, allow_key: &str) -> Option<String> {
    if tls || allow_plaintext {
        return None;
    }
    Some(format!(
        "{who}: a connection without TLS would hand the password (or a scramble of it anyone \
         can test guesses against) to whoever answers at that address, whichever \
         authentication plugin it asks for: configure TLS to it, or allow plain connections \
         to it with {allow_key}"
    ))
}

/// Runs a connection attempt so that a server's answer the driver cannot take (an RSA
/// key that is not PEM makes it panic) fails that attempt alone, as an I/O error.
pub async fn unwound<T>(
    attempt: impl Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, mysql_async::Error> {
    AssertUnwindSafe(attempt)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(mysql_async::Error::Io(mysql_async::IoError::Io(
                std::io::Error::other(format!(
                    "the server's answer during authentication could not be used ({what})"
                )),
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_connection_is_refused_unless_allowed_naming_the_setting() {
        let why = refusal(false, false, "source `shop`", "source_plaintext_hosts").unwrap();
        assert!(
            why.contains("source `shop`") && why.contains("source_plaintext_hosts"),
            "{why}"
        );
        assert!(refusal(true, false, "x", "k").is_none(), "TLS carries it");
        assert!(refusal(false, true, "x", "k").is_none(), "allowed");
    }

    #[tokio::test]
    async fn a_panicking_attempt_is_an_error_of_its_own() {
        let e = unwound::<()>(async { panic!("valid PEM is mandatory here") })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("valid PEM is mandatory here"), "{e}");
        assert_eq!(unwound(async { Ok(7) }).await.unwrap(), 7);
    }
}
