//! A WebRTC runtime whose UDP sockets have large kernel buffers.
//!
//! A data channel sends a gradient as a burst of SCTP packets. With Linux's default socket
//! receive buffer (`net.core.rmem_default`, 208 KiB) a burst of a few hundred kilobytes
//! overflows it whenever the receiving task is briefly busy; the kernel drops the datagrams
//! (`RcvbufErrors` in `/proc/net/snmp`) and SCTP waits out its one-second minimum
//! retransmission timeout. Steps then took about a second instead of tens of milliseconds.
//! Every socket the peer connection binds gets [`SOCKET_BUFFER_BYTES`] each way (the kernel
//! caps it at `net.core.rmem_max` / `wmem_max`; nothing else changes).
//!
//! It is also where a shaped network gets what this kernel cannot give it: Linux traffic
//! control here has `tbf` and `htb` (rate) but no `netem` (delay, loss). A [`LinkShim`] delays
//! every datagram a node sends by a fixed time and drops a seeded share of them, at the UDP
//! socket the mesh already wraps; the rate stays the kernel's. It exists for benchmarks and
//! tests (`lockstep bench wan`, `lockstep node --link-delay-ms`); a default shim does nothing.

use std::future::Future;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lockstep_luts::rng::SplitMix64;
use tokio::sync::mpsc;
use webrtc::runtime::{
    AsyncInterval, AsyncTcpListener, AsyncTcpStream, AsyncUdpSocket, JoinHandle, RecvMeta, Runtime, Transmit,
};

/// Kernel send and receive buffer asked for on each UDP socket.
pub const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// What a node's outgoing datagrams suffer on top of the real network (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkShim {
    /// Every datagram leaves this much later (one way; a round trip between two shimmed nodes
    /// gains twice this).
    pub delay_ms: u64,
    /// This many datagrams in a thousand are dropped, chosen by a generator seeded `seed`.
    pub loss_per_mille: u32,
    pub seed: u64,
}

impl LinkShim {
    pub fn is_active(&self) -> bool {
        self.delay_ms > 0 || self.loss_per_mille > 0
    }
}

/// Delegates everything to `inner`, enlarging UDP socket buffers on the way (and shaping the
/// sockets by `shim`).
#[derive(Debug)]
pub struct BufferedRuntime {
    inner: Arc<dyn Runtime>,
    shim: LinkShim,
}

impl BufferedRuntime {
    pub fn new(inner: Arc<dyn Runtime>) -> Self {
        BufferedRuntime { inner, shim: LinkShim::default() }
    }

    pub fn shaped(inner: Arc<dyn Runtime>, shim: LinkShim) -> Self {
        BufferedRuntime { inner, shim }
    }
}

/// One datagram waiting out the shim's delay.
struct Delayed {
    due: tokio::time::Instant,
    destination: SocketAddr,
    contents: Vec<u8>,
}

/// A UDP socket whose sends are delayed (in order, by a task of their own) and thinned.
#[derive(Debug)]
struct ShimmedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    delay: Duration,
    loss_per_mille: u32,
    rng: Mutex<SplitMix64>,
    queue: mpsc::UnboundedSender<Delayed>,
}

impl ShimmedSocket {
    fn new(inner: Arc<dyn AsyncUdpSocket>, shim: LinkShim) -> Self {
        let (queue, mut due) = mpsc::unbounded_channel::<Delayed>();
        let sender = inner.clone();
        tokio::spawn(async move {
            while let Some(datagram) = due.recv().await {
                tokio::time::sleep_until(datagram.due).await;
                // A failed send is a lost datagram, as on a real network.
                let _ = sender.send_to(&datagram.contents, datagram.destination).await;
            }
        });
        // Each socket its own stream of losses, still a function of the seed.
        let port = inner.local_addr().map_or(0, |a| u64::from(a.port()));
        ShimmedSocket {
            inner,
            delay: Duration::from_millis(shim.delay_ms),
            loss_per_mille: shim.loss_per_mille,
            rng: Mutex::new(SplitMix64::new(shim.seed ^ port.rotate_left(32))),
            queue,
        }
    }
}

impl AsyncUdpSocket for ShimmedSocket {
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn poll_send(&self, _cx: &mut Context<'_>, transmit: &Transmit<'_>) -> Poll<std::io::Result<usize>> {
        let len = transmit.contents.len();
        if self.loss_per_mille > 0 {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            if rng.below(1000) < u64::from(self.loss_per_mille) {
                return Poll::Ready(Ok(len));
            }
        }
        // `max_gso_segments` is 1: `contents` is one datagram.
        let datagram = Delayed {
            due: tokio::time::Instant::now() + self.delay,
            destination: transmit.destination,
            contents: transmit.contents.to_vec(),
        };
        match self.queue.send(datagram) {
            Ok(()) => Poll::Ready(Ok(len)),
            Err(_) => Poll::Ready(Err(std::io::Error::other("the shim's sender stopped"))),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn max_gro_segments(&self) -> usize {
        self.inner.max_gro_segments()
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
        let wrapped = self.inner.wrap_udp_socket(socket)?;
        if self.shim.is_active() {
            Ok(Arc::new(ShimmedSocket::new(wrapped, self.shim)))
        } else {
            Ok(wrapped)
        }
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

    /// Real sockets on 127.0.0.1: a shimmed sender's datagrams arrive no sooner than the
    /// delay, in order; with loss, about the share asked for goes missing (seeded).
    #[test]
    fn the_shim_delays_in_order_and_drops_a_seeded_share() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async {
            let receiver = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let to = receiver.local_addr().unwrap();
            let send_through = |shim: LinkShim| {
                let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                BufferedRuntime::shaped(webrtc::runtime::default_runtime().unwrap(), shim)
                    .wrap_udp_socket(socket)
                    .unwrap()
            };
            let delayed = send_through(LinkShim { delay_ms: 80, loss_per_mille: 0, seed: 1 });
            let sent = Instant::now();
            for i in 0..20u8 {
                delayed.send_to(&[i], to).await.unwrap();
            }
            let mut buf = [0u8; 8];
            for i in 0..20u8 {
                let (n, _) = receiver.recv_from(&mut buf).await.unwrap();
                assert_eq!(&buf[..n], &[i], "in order");
            }
            assert!(sent.elapsed() >= Duration::from_millis(80), "arrived after {:?}", sent.elapsed());
            let lossy = send_through(LinkShim { delay_ms: 1, loss_per_mille: 300, seed: 2 });
            for i in 0..200u8 {
                lossy.send_to(&[i], to).await.unwrap();
            }
            let mut got = 0;
            while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(300), receiver.recv_from(&mut buf)).await {
                got += 1;
            }
            assert!((100..180).contains(&got), "{got} of 200 arrived with 30% loss");
        });
    }
}
