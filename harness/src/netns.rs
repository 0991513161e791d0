//! Machines on one switch, made of network namespaces: a hub namespace holding a bridge (and
//! the signaling server, at [`HUB_ADDRESS`]), and one namespace per node joined to it by a veth
//! pair, each with its own network stack and address ([`Network::address`]). Root is needed;
//! everything is removed on drop.
//!
//! What the network does to packets is the kernel's: a node's uplink shaped by `tc tbf`
//! ([`Shaping`], for `bench wan`), and packets between nodes dropped by nftables rules on the
//! hub's bridge ([`DropRule`], for `chaos`): all of them (a cut, one way or both) or a share drawn at
//! random per packet (a loss burst). The rules sit where a switch would drop: neither end sees
//! an error, its packets just never arrive. (`tc netem` is not in these kernels; nftables'
//! bridge family and `numgen random` are.)

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{ensure, Context};

/// The hub's address on the bridge (the signaling server's).
pub const HUB_ADDRESS: &str = "10.78.0.1";

/// Runs `program args`, failing with its own words.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    ensure!(out.status.success(), "{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// A node's uplink: `rate_mbit`, with at most `queue_ms` of queue before the kernel drops (as a
/// real uplink's buffer would).
#[derive(Clone, Copy, Debug)]
pub struct Shaping {
    pub rate_mbit: f64,
    pub queue_ms: u64,
}

/// Packets the bridge drops: from node `from` (any node: `None`) to node `to` (any: `None`),
/// `per_cent` of them, drawn per packet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropRule {
    pub from: Option<usize>,
    pub to: Option<usize>,
    pub per_cent: u32,
}

/// The hub, its bridge and the nodes' namespaces.
pub struct Network {
    tag: String,
    /// The hub namespace's name (`ip netns exec HUB …` runs a process there).
    pub hub: String,
    nodes: Vec<String>,
}

impl Network {
    /// The hub and its bridge; `tag` makes the namespaces' names unique on the machine (no two
    /// networks at once may share one).
    pub fn new(tag: &str) -> anyhow::Result<Network> {
        let network = Network { tag: tag.to_string(), hub: format!("{tag}h"), nodes: Vec::new() };
        sh("ip", &["netns", "add", &network.hub]).context("creating network namespaces (root is needed)")?;
        let hub = network.hub.as_str();
        sh("ip", &["-n", hub, "link", "add", "br0", "type", "bridge"])?;
        sh("ip", &["-n", hub, "addr", "add", &format!("{HUB_ADDRESS}/24"), "dev", "br0"])?;
        sh("ip", &["-n", hub, "link", "set", "br0", "up"])?;
        sh("ip", &["-n", hub, "link", "set", "lo", "up"])?;
        Ok(network)
    }

    /// The address of node `index` on the bridge (at most [`Network::MAX_NODES`]).
    pub fn address(index: usize) -> String {
        format!("10.78.0.{}", 10 + index)
    }

    /// Nodes one network holds (a /24).
    pub const MAX_NODES: usize = 240;

    /// A new node's namespace joined to the bridge, its uplink shaped if asked; its index.
    pub fn add_node(&mut self, shaping: Option<Shaping>) -> anyhow::Result<usize> {
        let index = self.nodes.len();
        ensure!(index < Network::MAX_NODES, "a network holds {} nodes", Network::MAX_NODES);
        let ns = format!("{}n{index}", self.tag);
        sh("ip", &["netns", "add", &ns])?;
        self.nodes.push(ns.clone());
        let (inside, outside) = (format!("w{index}"), format!("b{index}"));
        sh(
            "ip",
            &["link", "add", &inside, "netns", &ns, "type", "veth", "peer", "name", &outside, "netns", &self.hub],
        )?;
        sh("ip", &["-n", &ns, "addr", "add", &format!("{}/24", Network::address(index)), "dev", &inside])?;
        sh("ip", &["-n", &ns, "link", "set", &inside, "up"])?;
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        sh("ip", &["-n", &self.hub, "link", "set", &outside, "master", "br0"])?;
        sh("ip", &["-n", &self.hub, "link", "set", &outside, "up"])?;
        if let Some(Shaping { rate_mbit, queue_ms }) = shaping {
            // tbf: the rate, a burst of 4 ms at that rate (at least 16 KB), and the queue.
            let burst = ((rate_mbit * 1e6 / 8.0 * 0.004) as u64).max(16 * 1024);
            let rate = format!("{}kbit", (rate_mbit * 1000.0) as u64);
            let (burst, latency) = (burst.to_string(), format!("{queue_ms}ms"));
            let tbf =
                ["qdisc", "add", "dev", &inside, "root", "tbf", "rate", &rate, "burst", &burst, "latency", &latency];
            sh("tc", &[&["-n", ns.as_str()][..], &tbf[..]].concat()).context("shaping a link with tc tbf")?;
        }
        Ok(index)
    }

    /// The namespace of node `index`.
    pub fn namespace(&self, index: usize) -> &str {
        &self.nodes[index]
    }

    /// A command that runs `program` inside node `index`'s namespace (`ip netns exec` execs
    /// it: the child's pid is the program's).
    pub fn launcher(&self, index: usize, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", self.namespace(index)]).arg(program);
        command
    }

    /// Makes `drops` the bridge's whole rule set (what was there before is replaced). The first
    /// call creates the table (nftables' `nft` is needed then).
    pub fn set_drops(&self, drops: &[DropRule]) -> anyhow::Result<()> {
        let mut script = String::from(
            "table bridge chaos {}\ndelete table bridge chaos\ntable bridge chaos {\n  chain links {\n    \
             type filter hook forward priority 0; policy accept;\n",
        );
        for drop in drops {
            let mut rule = String::from("    ");
            if let Some(from) = drop.from {
                rule += &format!("ip saddr {} ", Network::address(from));
            }
            if let Some(to) = drop.to {
                rule += &format!("ip daddr {} ", Network::address(to));
            }
            if drop.per_cent < 100 {
                rule += &format!("numgen random mod 100 < {} ", drop.per_cent);
            }
            script += &rule;
            script += "drop\n";
        }
        script += "  }\n}\n";
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.hub, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft (nftables) in the hub's namespace")?;
        child.stdin.take().context("nft's stdin")?.write_all(script.as_bytes())?;
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "nft refused the rules: {}\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace removes its ends of the veth pairs, and with them the others.
        for ns in self.nodes.iter().chain([&self.hub]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
