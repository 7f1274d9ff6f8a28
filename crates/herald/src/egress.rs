//! The egress proxy (`delivery.proxy_url`): operators who must deliver from fixed addresses
//! send every attempt through an HTTP CONNECT proxy. The destination guard has resolved
//! and judged the destination before the proxy hears of it; the proxy is asked for the
//! vetted address (never the name, which it could resolve elsewhere), and the original
//! host still goes in TLS SNI and in the `Host` header, both of which hyper sets from the
//! URL. The proxy's own address is the operator's, so it is not judged.

use std::fmt;
use std::net::SocketAddr;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use url::Url;

/// Longest CONNECT answer head read.
const MAX_ANSWER: usize = 8 * 1024;

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EgressProxy {
    host: String,
    port: u16,
    /// `Basic …` for `Proxy-Authorization`, from the URL's user and password.
    authorization: Option<String>,
}

impl fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = if self.authorization.is_some() { " (with credentials)" } else { "" };
        write!(f, "EgressProxy({}:{}{auth})", self.host, self.port)
    }
}

impl EgressProxy {
    /// Parses `http://[user:password@]host[:port]`, the only form accepted (the server's
    /// `delivery.proxy_url`, an application's `proxyUrl`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let refused = || "must be http://[user:password@]host:port (an HTTP CONNECT proxy)".to_owned();
        let url = Url::parse(text).map_err(|_| refused())?;
        if url.scheme() != "http" || url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(refused());
        }
        Self::from_url(&url).ok_or_else(refused)
    }

    /// The proxy without its credentials, as `http://host:port` (what reads may show).
    pub fn address(&self) -> String {
        match self.host.contains(':') {
            true => format!("http://[{}]:{}", self.host, self.port),
            false => format!("http://{}:{}", self.host, self.port),
        }
    }

    /// The `Proxy-Authorization` value, if the proxy has credentials (secret).
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    /// The proxy at `address` (as [`Self::address`] shows it) with `authorization`.
    pub fn from_parts(address: &str, authorization: Option<String>) -> Option<Self> {
        let proxy = Self::parse(address).ok()?;
        Some(Self { authorization, ..proxy })
    }

    /// From `http://[user:password@]host:port`.
    pub fn from_url(url: &Url) -> Option<Self> {
        let host = url.host_str()?.trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = url.port_or_known_default()?;
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        let authorization = (!url.username().is_empty()).then(|| {
            let pair = format!("{}:{}", decode(url.username()), decode(url.password().unwrap_or_default()));
            format!("Basic {}", STANDARD.encode(pair))
        });
        Some(Self { host, port, authorization })
    }

    /// A tunnel to `destination` (an address the guard vetted) through the proxy.
    pub async fn connect(&self, destination: SocketAddr) -> Result<TcpStream, String> {
        let mut stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connecting to the egress proxy {}:{}: {e}", self.host, self.port))?;
        let _ = stream.set_nodelay(true);
        let mut request = format!("CONNECT {destination} HTTP/1.1\r\nHost: {destination}\r\n");
        if let Some(auth) = &self.authorization {
            request.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| format!("writing to the egress proxy: {e}"))?;
        let head = read_head(&mut stream).await?;
        let status = head.split_whitespace().nth(1).unwrap_or_default();
        if status != "200" {
            let line = head.lines().next().unwrap_or_default();
            return Err(format!("the egress proxy refused the tunnel to {destination}: {line}"));
        }
        Ok(stream)
    }
}

/// Reads the proxy's answer up to the blank line, byte by byte, so nothing of the tunnel
/// that follows is consumed.
async fn read_head(stream: &mut TcpStream) -> Result<String, String> {
    let mut head = Vec::with_capacity(128);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_ANSWER {
            return Err("the egress proxy's answer is too long".into());
        }
        let byte = stream.read_u8().await.map_err(|e| format!("reading the egress proxy's answer: {e}"))?;
        head.push(byte);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_url_and_stay_out_of_debug() {
        let proxy = EgressProxy::from_url(&Url::parse("http://eg%40ress:p%3Ass@proxy.internal:3128").unwrap()).unwrap();
        assert_eq!((proxy.host.as_str(), proxy.port), ("proxy.internal", 3128));
        assert_eq!(proxy.authorization.as_deref(), Some(format!("Basic {}", STANDARD.encode("eg@ress:p:ss")).as_str()));
        let shown = format!("{proxy:?}");
        assert!(!shown.contains("p:ss") && !shown.contains("Basic") && !shown.contains("eg@"), "{shown}");
        let bare = EgressProxy::from_url(&Url::parse("http://10.0.0.1").unwrap()).unwrap();
        assert_eq!((bare.port, bare.authorization.clone()), (80, None));
        assert_eq!(proxy.address(), "http://proxy.internal:3128");
        let again = EgressProxy::from_parts(&proxy.address(), proxy.authorization().map(str::to_owned)).unwrap();
        assert_eq!(again, proxy);
        for bad in ["https://p:1", "socks5://p:1", "http://p:1/path", "http://p:1/?q", "p:1"] {
            assert!(EgressProxy::parse(bad).is_err(), "{bad}");
        }
    }
}
