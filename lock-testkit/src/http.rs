//! A tiny hand-written HTTP/1.0 client, enough for etcd's `/health` and its
//! JSON gRPC gateway (no HTTP client dependency).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends one HTTP/1.0 request and returns `(status code, body)`.
///
/// The whole exchange (connect, write, read until the server closes) is
/// bounded by `timeout`; a paused server yields a `TimedOut` error.
pub(crate) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, io::Error>(response)
    };
    let response = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "HTTP request timed out"))??;
    parse_response(&response)
}

fn parse_response(response: &[u8]) -> io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(response);
    let invalid = || io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP response");
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(invalid)?;
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(invalid)?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    #[test]
    fn parses_status_and_body() {
        let raw = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{\"health\":\"true\"}";
        let (status, body) = parse_response(raw).unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, "{\"health\":\"true\"}");
        assert!(parse_response(b"garbage").is_err());
    }
}
