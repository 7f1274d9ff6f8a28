//! A TCP proxy between Herald and a receiver that can add latency, reset connections, or
//! swallow them (a blackhole), switched at run time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Every chunk waits 300 ms each way.
    Latency = 1,
    /// New connections are reset at once; open ones at their next chunk.
    Reset = 2,
    /// Connections are accepted and nothing is forwarded or answered.
    Blackhole = 3,
}

#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
        let shared = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, shared.clone()));
            }
        });
        Self { addr, mode }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

fn mode_of(mode: &AtomicU8) -> Mode {
    match mode.load(Ordering::SeqCst) {
        1 => Mode::Latency,
        2 => Mode::Reset,
        3 => Mode::Blackhole,
        _ => Mode::Pass,
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, mode: Arc<AtomicU8>) {
    match mode_of(&mode) {
        Mode::Reset => return reset(client),
        Mode::Blackhole => return swallow(client).await,
        _ => {}
    }
    let Ok(server) = TcpStream::connect(upstream).await else { return reset(client) };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = {
        let mode = mode.clone();
        async move { pump(&mut client_read, &mut server_write, &mode).await }
    };
    let down = async move { pump(&mut server_read, &mut client_write, &mode).await };
    let _ = tokio::join!(up, down);
}

/// Copies one direction, applying the mode to every chunk.
async fn pump(from: &mut (impl AsyncReadExt + Unpin), to: &mut (impl AsyncWriteExt + Unpin), mode: &AtomicU8) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match mode_of(mode) {
            Mode::Pass => {}
            Mode::Latency => tokio::time::sleep(Duration::from_millis(300)).await,
            // Stop relaying: dropping both halves closes the connection under the peers.
            Mode::Reset | Mode::Blackhole => break,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Reads and discards until the peer gives up.
async fn swallow(mut stream: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
}
