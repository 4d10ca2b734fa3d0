//! The center's listeners and their TLS: the gRPC API with the API's certificate (and,
//! for mTLS, its client CA), the console and the search API with the same certificate,
//! the dictionaries in plain HTTP (Elasticsearch nodes poll them; they hold nothing
//! secret). Each takes connections within `[limits]` (`sluice_runtime::listen`).

use std::pin::Pin;
use std::task::{Context, Poll};

use sluice_runtime::listen::{self, Conn, Peer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;

use crate::config::{ApiSection, AuthMode};
use crate::error::{CenterError, Result};

const KEYS: listen::tls::Keys<'static> = listen::tls::Keys {
    cert: "api.tls_cert",
    key: "api.tls_key",
    client_ca: "api.client_ca",
};

/// The gRPC API's TLS (HTTP/2), asking clients for a certificate under mTLS.
pub(crate) fn grpc_tls(api: &ApiSection) -> Result<Option<TlsAcceptor>> {
    let client_ca = match api.auth {
        AuthMode::Mtls => api.client_ca.as_deref(),
        _ => None,
    };
    acceptor(api, client_ca, &[b"h2"])
}

/// The TLS of the center's HTTP listeners (the console, the search API): the API's
/// certificate, no client certificate asked for (they have logins and tokens of their own).
pub(crate) fn http_tls(api: &ApiSection) -> Result<Option<TlsAcceptor>> {
    acceptor(api, None, &[b"http/1.1"])
}

fn acceptor(
    api: &ApiSection,
    client_ca: Option<&std::path::Path>,
    alpn: &[&[u8]],
) -> Result<Option<TlsAcceptor>> {
    match (&api.tls_cert, &api.tls_key) {
        (Some(cert), Some(key)) => listen::tls::acceptor(cert, key, client_ca, alpn, &KEYS)
            .map(Some)
            .map_err(CenterError::definite),
        _ => Ok(None),
    }
}

/// A connection of the gRPC API, as tonic takes it: its peer is every request's
/// [`Peer`] extension (address, client certificates).
pub(crate) struct GrpcConn(pub(crate) Conn);

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.0.peer().clone()
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The client certificate (leaf, DER) of a request's connection, if it presented one.
pub(crate) fn client_certificate(ext: &tonic::codegen::http::Extensions) -> Option<&[u8]> {
    ext.get::<Peer>()
        .and_then(|p| p.certs.first())
        .map(|c| c.as_ref())
}

/// The address of a request's client, as its connection gives it.
pub(crate) fn client_addr(ext: &tonic::codegen::http::Extensions) -> String {
    ext.get::<Peer>()
        .map(|p| p.addr.to_string())
        .unwrap_or_default()
}

/// The address of a request's client without its port (`0.0.0.0` when unknown).
pub(crate) fn client_ip(ext: &tonic::codegen::http::Extensions) -> std::net::IpAddr {
    ext.get::<Peer>()
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.addr.ip())
}
