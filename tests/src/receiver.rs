//! A one-route callback receiver, over plain HTTP or over TLS: it answers each request with
//! the next of a list of statuses and hands over each body it got.

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Starts a receiver on 127.0.0.1 that answers each request with the next status of `statuses`
/// (the last one repeats) and sends each JSON body it got down the channel; with `tls`, it
/// speaks https. Answers its URL (`/done`).
pub async fn callback_receiver(
    statuses: Vec<u16>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}/done", listener.local_addr().unwrap());
    let (bodies, inbox) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for n in 0.. {
            let (stream, _) = listener.accept().await.unwrap();
            let status = statuses[n.min(statuses.len() - 1)];
            let body = match &tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(mut stream) => answer_one(&mut stream, status).await,
                    // A client that refused our certificate: nothing to hand over.
                    Err(_) => continue,
                },
                None => {
                    let mut stream = stream;
                    answer_one(&mut stream, status).await
                }
            };
            let _ = bodies.send(body);
        }
    });
    (url, inbox)
}

/// Reads one request, answers `status`, and returns its JSON body.
async fn answer_one<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, status: u16) -> Value {
    let mut request = Vec::new();
    let mut chunk = [0u8; 4096];
    let body_start = loop {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "the request ended early");
        request.extend_from_slice(&chunk[..read]);
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..body_start]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    while request.len() < body_start + length {
        let read = stream.read(&mut chunk).await.unwrap();
        request.extend_from_slice(&chunk[..read]);
    }
    let body = serde_json::from_slice(&request[body_start..body_start + length]).unwrap();
    let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    stream.write_all(reply.as_bytes()).await.unwrap();
    let _ = stream.shutdown().await;
    body
}
