//! `lockstep bench exchange`: data-channel throughput on loopback, for the mesh's channel
//! configuration and for a naive one, beside plain TCP, in the same run.
//!
//! Both ends live in this process; the descriptions are exchanged directly (no signaling
//! server), after ICE gathering completes, exactly as the mesh does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use webrtc::data_channel::{DataChannel, DataChannelEvent, RTCDataChannelInit};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCConfigurationBuilder, RTCIceGatheringState,
    SettingEngineBuilder,
};

/// Which channel configuration to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// The crate's defaults (only mDNS off and a loopback bind, or it cannot connect here):
    /// one reliable ordered channel, unbounded send buffer, messages sent in a loop.
    Naive,
    /// The mesh's configuration ([`crate::config::channel_settings`]).
    Mesh,
}

struct Gather {
    gathered: mpsc::UnboundedSender<()>,
    channel: mpsc::UnboundedSender<Arc<dyn DataChannel>>,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Gather {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        if state == RTCIceGatheringState::Complete {
            let _ = self.gathered.send(());
        }
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        let _ = self.channel.send(channel);
    }
}

async fn connection(
    flavor: Flavor,
) -> anyhow::Result<(Arc<dyn PeerConnection>, mpsc::UnboundedReceiver<()>, mpsc::UnboundedReceiver<Arc<dyn DataChannel>>)>
{
    let (gathered_tx, gathered) = mpsc::unbounded_channel();
    let (channel_tx, channels) = mpsc::unbounded_channel();
    let builder = PeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().build())
        .with_handler(Arc::new(Gather { gathered: gathered_tx, channel: channel_tx }))
        .with_runtime(match flavor {
            Flavor::Naive => webrtc::runtime::default_runtime().context("no runtime")?,
            Flavor::Mesh => crate::config::mesh_runtime(crate::sockets::LinkShim::default())?,
        })
        .with_udp_addrs(vec!["127.0.0.1:0".to_string()]);
    let builder = match flavor {
        Flavor::Naive => builder.with_setting_engine(
            SettingEngineBuilder::new()
                .with_multicast_dns_mode(rtc::ice::mdns::MulticastDnsMode::Disabled)
                .with_include_loopback_candidate(true)
                .build(),
        ),
        Flavor::Mesh => crate::config::channel_settings(builder, true, true),
    };
    Ok((Arc::new(builder.build().await?), gathered, channels))
}

/// A connected pair: the offerer's channel and the answerer's.
async fn pair(
    flavor: Flavor,
) -> anyhow::Result<(Vec<Arc<dyn PeerConnection>>, Arc<dyn DataChannel>, Arc<dyn DataChannel>)> {
    let (a, mut a_gathered, _) = connection(flavor).await?;
    let (b, mut b_gathered, mut b_channels) = connection(flavor).await?;
    let sender =
        a.create_data_channel("bench", Some(RTCDataChannelInit { ordered: true, ..Default::default() })).await?;
    let offer = a.create_offer(None).await?;
    a.set_local_description(offer).await?;
    a_gathered.recv().await;
    b.set_remote_description(a.local_description().await.context("offer")?).await?;
    let answer = b.create_answer(None).await?;
    b.set_local_description(answer).await?;
    b_gathered.recv().await;
    a.set_remote_description(b.local_description().await.context("answer")?).await?;
    let receiver = tokio::time::timeout(Duration::from_secs(10), b_channels.recv())
        .await
        .context("the data channel did not arrive")?
        .context("no channel")?;
    // Wait until the sender's side is open.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), sender.poll()).await {
            Ok(Some(DataChannelEvent::OnOpen)) => break,
            Ok(Some(_)) => {}
            _ => bail!("the data channel did not open"),
        }
    }
    Ok((vec![a, b], sender, receiver))
}

/// Sends `total` bytes in `message`-byte messages over each pair at once; MB/s summed over
/// the pairs (1 MB = 10^6 bytes).
pub async fn data_channel_mb_per_s(flavor: Flavor, pairs: usize, message: usize, total: usize) -> anyhow::Result<f64> {
    let mut links = Vec::new();
    for _ in 0..pairs {
        links.push(pair(flavor).await?);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (_, sender, receiver) in &links {
        let sender = sender.clone();
        let receiver = receiver.clone();
        tasks.push(tokio::spawn(async move {
            let reading = tokio::spawn(async move {
                let mut got = 0usize;
                while got < total {
                    match receiver.poll().await {
                        Some(DataChannelEvent::OnMessage(m)) => got += m.data.len(),
                        Some(DataChannelEvent::OnClose) | None => break,
                        _ => {}
                    }
                }
                got
            });
            let payload = BytesMut::from(&vec![7u8; message][..]);
            let mut sent = 0;
            while sent < total {
                sender.send(payload.clone()).await?;
                sent += message;
            }
            let got = reading.await?;
            anyhow::ensure!(got >= total, "received {got} of {total} bytes");
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    for (connections, _, _) in links {
        for c in connections {
            let _ = c.close().await;
        }
    }
    Ok((pairs * total) as f64 / seconds / 1e6)
}

/// Plain TCP on loopback, same message size.
pub async fn tcp_mb_per_s(message: usize, total: usize) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0usize;
        while got < total {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(got)
    });
    let mut socket = tokio::net::TcpStream::connect(address).await?;
    socket.set_nodelay(true)?;
    let payload = vec![7u8; message];
    let started = Instant::now();
    let mut sent = 0;
    while sent < total {
        socket.write_all(&payload).await?;
        sent += message;
    }
    socket.flush().await?;
    let got = reader.await??;
    anyhow::ensure!(got >= total, "TCP received {got} of {total} bytes");
    Ok(total as f64 / started.elapsed().as_secs_f64() / 1e6)
}
