//! A WebRTC runtime whose UDP sockets have large kernel buffers.
//!
//! A data channel sends a gradient as a burst of SCTP packets. With Linux's default socket
//! receive buffer (`net.core.rmem_default`, 208 KiB) a burst of a few hundred kilobytes
//! overflows it whenever the receiving task is briefly busy; the kernel drops the datagrams
//! (`RcvbufErrors` in `/proc/net/snmp`) and SCTP waits out its one-second minimum
//! retransmission timeout. Steps then took about a second instead of tens of milliseconds.
//! Every socket the peer connection binds gets [`SOCKET_BUFFER_BYTES`] each way (the kernel
//! caps it at `net.core.rmem_max` / `wmem_max`; nothing else changes).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use webrtc::runtime::{AsyncInterval, AsyncTcpListener, AsyncTcpStream, AsyncUdpSocket, JoinHandle, Runtime};

/// Kernel send and receive buffer asked for on each UDP socket.
pub const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// Delegates everything to `inner`, enlarging UDP socket buffers on the way.
#[derive(Debug)]
pub struct BufferedRuntime {
    inner: Arc<dyn Runtime>,
}

impl BufferedRuntime {
    pub fn new(inner: Arc<dyn Runtime>) -> Self {
        BufferedRuntime { inner }
    }
}

impl Runtime for BufferedRuntime {
    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) -> Box<dyn JoinHandle> {
        self.inner.spawn(future)
    }

    fn spawn_reactor(
        &self,
        reactor_pool_size: usize,
        future: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Box<dyn JoinHandle> {
        self.inner.spawn_reactor(reactor_pool_size, future)
    }

    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> std::io::Result<Arc<dyn AsyncUdpSocket>> {
        let handle = socket2::SockRef::from(&socket);
        // Best effort: a smaller buffer is slower, never wrong.
        let _ = handle.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
        let _ = handle.set_send_buffer_size(SOCKET_BUFFER_BYTES);
        self.inner.wrap_udp_socket(socket)
    }

    fn wrap_tcp_listener(&self, listener: std::net::TcpListener) -> std::io::Result<Arc<dyn AsyncTcpListener>> {
        self.inner.wrap_tcp_listener(listener)
    }

    fn connect_tcp<'a>(
        &'a self,
        remote_addr: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Arc<dyn AsyncTcpStream>>> + Send + 'a>> {
        self.inner.connect_tcp(remote_addr)
    }

    fn resolve_host<'a>(
        &'a self,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'a>> {
        self.inner.resolve_host(host)
    }

    fn now(&self) -> Instant {
        self.inner.now()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.inner.sleep(duration)
    }

    fn interval(&self, period: Duration) -> Box<dyn AsyncInterval> {
        self.inner.interval(period)
    }

    fn block_on(&self, future: Pin<Box<dyn Future<Output = ()> + '_>>) {
        self.inner.block_on(future)
    }

    fn yield_now(&self) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.inner.yield_now()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapped_sockets_get_larger_receive_buffers() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _guard = runtime.enter();
        let plain = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = socket2::SockRef::from(&plain).recv_buffer_size().unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        let probe = socket.try_clone().unwrap();
        let buffered = BufferedRuntime::new(webrtc::runtime::default_runtime().unwrap());
        buffered.wrap_udp_socket(socket).unwrap();
        let after = socket2::SockRef::from(&probe).recv_buffer_size().unwrap();
        // Linux reports twice the size asked for, capped by `net.core.rmem_max`.
        assert!(after > before, "receive buffer stayed at {after} bytes (default {before})");
    }
}
