//! Whether a connection may send its password. MySQL 8.4 and 9.x authenticate with
//! `caching_sha2_password` (9.x has no `mysql_native_password` at all): over TLS the
//! password goes inside the encrypted channel; over plain TCP, when the server has not
//! cached it, the client asks the server for its RSA public key and encrypts the password
//! with it — a key anyone between the two could have sent instead. So a plain connection
//! to such a server is made only where a setting (`allow_public_key_retrieval`) says so,
//! as MySQL's own clients ask (`--get-server-public-key`); otherwise it is refused before
//! any credential leaves, with what to configure.

use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Plugins that need TLS or the server's RSA key to send a password.
const RSA_PLUGINS: [&str; 2] = ["caching_sha2_password", "sha256_password"];

/// What a server says of itself before authentication: its version and the default
/// authentication plugin of its handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub version: String,
    pub plugin: String,
}

/// Reads the server's initial handshake (protocol 10) and closes the connection.
pub async fn greeting(host: &str, port: u16) -> std::io::Result<Greeting> {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await?;
        let mut header = [0u8; 4];
        stream.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await?;
        parse_greeting(&payload).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the server's first packet is not a protocol-10 handshake",
            )
        })
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no handshake within 10 s")
        })?
}

/// The version and plugin of a handshake packet's payload.
fn parse_greeting(p: &[u8]) -> Option<Greeting> {
    if *p.first()? != 10 {
        return None;
    }
    let rest = &p[1..];
    let end = rest.iter().position(|&b| b == 0)?;
    let version = String::from_utf8_lossy(&rest[..end]).into_owned();
    // thread id 4, auth data part 1 8, filler 1, capabilities 2, charset 1, status 2,
    // capabilities 2, auth data length 1, reserved 10, then auth data part 2.
    let fixed = &rest[end + 1..];
    let auth_len = *fixed.get(4 + 8 + 1 + 2 + 1 + 2 + 2)? as usize;
    let part2 = auth_len.saturating_sub(8).max(13);
    let plugin_at = 4 + 8 + 1 + 2 + 1 + 2 + 2 + 1 + 10 + part2;
    let plugin = fixed
        .get(plugin_at..)
        .map(|b| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        })
        .unwrap_or_default();
    Some(Greeting { version, plugin })
}

/// Why a connection as `who` with these settings must not send its password, if so.
pub fn refusal(
    greeting: &Greeting,
    tls: bool,
    allow_key_retrieval: bool,
    who: &str,
) -> Option<String> {
    if tls || allow_key_retrieval || !RSA_PLUGINS.contains(&greeting.plugin.as_str()) {
        return None;
    }
    Some(format!(
        "{who}: the server ({}) authenticates with {} and the connection has no TLS, so the \
         password would be encrypted with an RSA key the server sends unauthenticated: \
         configure TLS to it, or set allow_public_key_retrieval = true to accept that",
        greeting.version, greeting.plugin
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake as MySQL 9.7 and MariaDB 10.11 send it (captured on the stack).
    fn handshake(version: &str, plugin: &str) -> Vec<u8> {
        let mut p = vec![10];
        p.extend_from_slice(version.as_bytes());
        p.push(0);
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(b"abcdefgh");
        p.push(0);
        p.extend_from_slice(&[0xff, 0xf7, 0x21, 0x02, 0x00, 0xff, 0xdf]);
        p.push(21);
        p.extend_from_slice(&[0; 10]);
        p.extend_from_slice(b"ijklmnopqrst\0");
        p.extend_from_slice(plugin.as_bytes());
        p.push(0);
        p
    }

    #[test]
    fn the_greeting_names_the_version_and_the_plugin() {
        let g = parse_greeting(&handshake("9.7.4-2", "caching_sha2_password")).unwrap();
        assert_eq!(g.version, "9.7.4-2");
        assert_eq!(g.plugin, "caching_sha2_password");
        assert!(parse_greeting(&[0xff, 1, 2]).is_none());
    }

    #[test]
    fn a_plain_connection_to_caching_sha2_is_refused_unless_allowed() {
        let mysql = parse_greeting(&handshake("9.7.4-2", "caching_sha2_password")).unwrap();
        let why = refusal(&mysql, false, false, "source `shop`").expect("refused");
        assert!(
            why.contains("source `shop`") && why.contains("allow_public_key_retrieval"),
            "{why}"
        );
        assert!(
            refusal(&mysql, true, false, "x").is_none(),
            "TLS carries it"
        );
        assert!(refusal(&mysql, false, true, "x").is_none(), "allowed");
        let mariadb =
            parse_greeting(&handshake("10.11.19-MariaDB", "mysql_native_password")).unwrap();
        assert!(refusal(&mariadb, false, false, "x").is_none());
    }
}
