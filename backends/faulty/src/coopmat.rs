//! The second Vulkan driver the `tc` backend's tests run on: Mesa 26's lavapipe, which reports
//! int8 cooperative matrices, unpacked by `scripts/vulkan-coopmat.sh` with trixie's C library,
//! loader and SPIRV-Tools into a directory of its own (`docs/TENSOR_CORES.md`). Programs run there
//! under that directory's dynamic loader, with only that driver visible.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The unpacked driver's directory.
pub struct CoopmatDriver {
    root: PathBuf,
}

impl CoopmatDriver {
    /// `$LOCKSTEP_COOPMAT_ROOT`, else `~/.cache/lockstep/vulkan-coopmat`; panics (a test's
    /// failure, never a skip) when the script has not unpacked it there.
    pub fn unpacked() -> Self {
        let root = std::env::var_os("LOCKSTEP_COOPMAT_ROOT").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/lockstep/vulkan-coopmat")
        });
        assert!(root.join("ready").exists(), "{} is missing: run scripts/vulkan-coopmat.sh", root.display());
        CoopmatDriver { root }
    }

    /// The libraries' directory (the C library, the Vulkan loader, Mesa's drivers).
    pub fn lib(&self) -> PathBuf {
        self.root.join("fs/usr/lib/x86_64-linux-gnu")
    }

    /// The dynamic loader everything there must run under.
    pub fn loader(&self) -> PathBuf {
        self.lib().join("ld-linux-x86-64.so.2")
    }

    /// The ICD file naming that lavapipe, for `VK_DRIVER_FILES`.
    pub fn icd(&self) -> PathBuf {
        self.root.join("lvp.json")
    }

    /// A program unpacked with it (`spirv-val`).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.join("fs/usr/bin").join(name)
    }

    /// This test binary's `test` again, in a child process under the driver's loader with
    /// only that driver visible (`child` set in its environment, so the test knows to run its
    /// body there); fails with the child's output unless it passed.
    pub fn rerun_test(&self, test: &str, child: &str, env: &[(&str, &std::ffi::OsStr)]) {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut command = self.command(&exe);
        command.args(["--exact", test, "--nocapture", "--test-threads", "1"]).env(child, "1");
        for (key, value) in env {
            command.env(key, value);
        }
        let out = command.output().expect("the test binary runs under the driver's loader");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{test} on the cooperative driver:\n{text}");
    }

    /// `program` run under the driver's loader with only that driver visible.
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(self.loader());
        command.arg("--library-path").arg(self.lib()).arg(program).env("VK_DRIVER_FILES", self.icd());
        command
    }
}
