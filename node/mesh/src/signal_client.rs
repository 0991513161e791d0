//! The signaling client: a tokio-tungstenite connection that reads and writes
//! `lockstep_signaling::protocol`'s messages (client and server share one definition); a message
//! it cannot read is reported, not fatal.

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use lockstep_node::wire::PeerId;
use lockstep_signaling::protocol::{ClientMessage, ServerMessage};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::config::{MeshConfig, AGENT};
use crate::inbound::{Inbound, InboundTx};

/// A new signaling connection: the sender for messages to the server (a writer task runs
/// already), and the reader, not yet started — it turns the server's frames into
/// `Inbound::Signal` and ends with `SignalClosed`. The caller starts it once the loop knows the
/// connection, so the connection's end can never reach the loop before the connection does.
pub(crate) struct SignalConnection {
    pub(crate) sender: mpsc::UnboundedSender<ClientMessage>,
    reader: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl SignalConnection {
    pub(crate) fn start_reading(self) -> mpsc::UnboundedSender<ClientMessage> {
        tokio::spawn(self.reader);
        self.sender
    }
}

/// The URL this node connects to the signaling server with: the configured one, saying what we
/// are (`agent`), and with the place to take back (`resume`, its token) when we have one.
pub(crate) fn signal_url(config: &MeshConfig, resume: Option<(PeerId, &str)>) -> String {
    let separator = if config.signal_url.contains('?') { '&' } else { '?' };
    let mut url = format!("{}{separator}agent={AGENT}&id={}", config.signal_url, config.id);
    if let Some((id, token)) = resume {
        url.push_str(&format!("&resume={id}&token={token}"));
    }
    url
}

/// Connects to the signaling server at `url`; see [`SignalConnection`].
pub(crate) async fn connect_signal(url: &str, inbound: InboundTx) -> anyhow::Result<SignalConnection> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .with_context(|| format!("connecting to the signaling server at {url}"))?;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (signal_tx, mut signal_out) = mpsc::unbounded_channel::<ClientMessage>();
    let reader = Box::pin(async move {
        while let Some(frame) = ws_rx.next().await {
            match frame {
                Ok(WsMessage::Text(text)) => {
                    let message = serde_json::from_str::<ServerMessage>(text.as_str())
                        .map_err(|e| format!("an unreadable message from the signaling server ({e}): {text}"));
                    let _ = inbound.send(Inbound::Signal(message));
                }
                Ok(WsMessage::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = inbound.send(Inbound::SignalClosed("the signaling connection closed".into()));
    });
    tokio::spawn(async move {
        while let Some(message) = signal_out.recv().await {
            let Ok(text) = serde_json::to_string(&message) else { continue };
            if ws_tx.send(WsMessage::text(text)).await.is_err() {
                break;
            }
        }
    });
    Ok(SignalConnection { sender: signal_tx, reader })
}
