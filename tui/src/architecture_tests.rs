//! The checkable parts of `docs/ARCHITECTURE.md`, checked on every `cargo test`: which crates
//! depend on which, no clock or socket in the sans-I/O cores, no import cycle between the
//! modules of any crate, `lib.rs` files as faces, every crate on the workspace's `rust-version`,
//! and no comment that points at a document outside the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The workspace members, from the root manifest.
fn members() -> Vec<String> {
    let manifest = read(&root().join("Cargo.toml"));
    let list = manifest.split("members = [").nth(1).and_then(|rest| rest.split(']').next()).expect("a members list");
    list.split(',').map(|m| m.trim().trim_matches('"').to_string()).filter(|m| !m.is_empty()).collect()
}

/// The workspace crates a member's `[dependencies]` names (not dev-dependencies).
fn workspace_dependencies(member: &str) -> BTreeSet<String> {
    let manifest = read(&root().join(member).join("Cargo.toml"));
    let Some(section) = manifest.split("\n[dependencies]\n").nth(1) else { return BTreeSet::new() };
    let section = section.split("\n[").next().unwrap_or("");
    section
        .lines()
        .filter_map(|line| line.split(['.', ' ', '=']).next())
        .filter(|name| name.starts_with("lockstep-"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crate_graph_is_the_one_the_architecture_describes() {
    // Adding an edge here is a design decision: record it in docs/ARCHITECTURE.md too.
    let expected: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("luts", &[][..]),
        // The ABI's op records decode to the one definition of the ops (pure).
        ("worker-api", &["lockstep-luts"]),
        ("shaders", &[]),
        // The host implements node's compute trait for loaded plugins (the glue), so node
        // never loads a plugin.
        ("backends/host", &["lockstep-luts", "lockstep-node", "lockstep-worker-api"]),
        ("backends/quantize", &["lockstep-luts"]),
        ("backends/cpu", &["lockstep-luts", "lockstep-quantize", "lockstep-worker-api"]),
        ("backends/gpu", &["lockstep-luts", "lockstep-quantize", "lockstep-shaders", "lockstep-worker-api"]),
        ("backends/lut", &["lockstep-gpu", "lockstep-worker-api"]),
        ("backends/dp4a", &["lockstep-gpu", "lockstep-worker-api"]),
        ("backends/tc", &["lockstep-gpu", "lockstep-worker-api"]),
        ("backends/faulty", &["lockstep-luts", "lockstep-worker-api"]),
        // The node's pure core: the units and nothing that does I/O.
        ("node", &["lockstep-luts"]),
        ("node/mesh", &["lockstep-luts", "lockstep-node", "lockstep-signaling"]),
        ("signaling", &[]),
        (
            "tui",
            &[
                "lockstep-backends",
                "lockstep-luts",
                "lockstep-mesh",
                "lockstep-node",
                "lockstep-signaling",
                "lockstep-worker-api",
            ],
        ),
        // What measures and tries the product from outside, on the runtime's public pieces;
        // nothing on a training node's path depends on it.
        (
            "harness",
            &[
                "lockstep-backends",
                "lockstep-luts",
                "lockstep-mesh",
                "lockstep-node",
                "lockstep-signaling",
                "lockstep-tui",
                "lockstep-worker-api",
            ],
        ),
        // The binary: parses the command line and calls the two.
        ("cli", &["lockstep-harness", "lockstep-tui"]),
    ]);
    let members = members();
    assert_eq!(members.iter().map(String::as_str).collect::<BTreeSet<_>>(), expected.keys().copied().collect());
    for member in &members {
        let found = workspace_dependencies(member);
        let wanted: BTreeSet<String> = expected[member.as_str()].iter().map(|s| s.to_string()).collect();
        assert_eq!(found, wanted, "{member}'s workspace dependencies");
    }
}

#[test]
fn every_crate_inherits_the_workspace_rust_version() {
    assert!(read(&root().join("Cargo.toml")).contains("\nrust-version = \"1.89\"\n"));
    for member in members() {
        let manifest = read(&root().join(&member).join("Cargo.toml"));
        assert!(manifest.contains("\nrust-version.workspace = true\n"), "{member} does not inherit rust-version");
    }
}

/// Lines of code (comments and the test module dropped) that contain `word`.
fn code_mentions(path: &Path, word: &str) -> Vec<String> {
    let text = read(path);
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .filter(|code| code.contains(word))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_sans_io_cores_read_no_clock_and_touch_no_socket() {
    let root = root();
    let mut cores: Vec<PathBuf> =
        ["node/src/wire.rs", "node/src/sync.rs", "signaling/src/hub.rs"].iter().map(|p| root.join(p)).collect();
    cores.extend(sources(&root.join("node/src/session")));
    cores.extend(sources(&root.join("node/src/sync")));
    cores.extend(sources(&root.join("node/src/wire")));
    cores.extend(sources(&root.join("luts/src")));
    // Time arrives as an input (`now`); reading the clock is the adapters' job.
    let forbidden = [
        "Instant::now",
        "SystemTime",
        "elapsed()",
        "std::net",
        "TcpStream",
        "UdpSocket",
        "tokio",
        "thread::sleep",
        "std::fs",
    ];
    for file in &cores {
        for word in forbidden {
            let hits = code_mentions(file, word);
            // The table generator writes its one file.
            if word == "std::fs" && file.ends_with("luts/src/bin/generate_luts.rs") {
                continue;
            }
            assert!(hits.is_empty(), "{} mentions `{word}`: {hits:?}", file.display());
        }
    }
    // The rest of `node` does no network I/O, and only the replica times anything (its
    // admission's and hash seconds, for the reports; never for a decision).
    for file in sources(&root.join("node/src")) {
        for word in ["std::net", "TcpStream", "UdpSocket", "SystemTime", "tokio", "reqwest", "libloading"] {
            assert!(code_mentions(&file, word).is_empty(), "{} mentions `{word}`", file.display());
        }
        if !file.ends_with("node/src/replica.rs") && !file.ends_with("node/src/replica/hash.rs") {
            assert!(code_mentions(&file, "Instant::now").is_empty(), "{} reads a clock", file.display());
        }
    }
}

/// The top-level module a file of a crate belongs to (`console/view.rs` → `console`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src");
    let first = relative.components().next().expect("a component").as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every crate's `src` folder (the workspace members').
fn crate_sources() -> Vec<PathBuf> {
    members().into_iter().map(|m| root().join(m).join("src")).filter(|src| src.is_dir()).collect()
}

/// The names a file refers to through `crate::` (`crate::a::b`, `crate::{a, b::c}`: `a`, `b`),
/// comments dropped.
fn crate_references(text: &str) -> BTreeSet<String> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        // `$crate::` is a macro's path to the crate it was defined in, not a reference.
        if code[..i].ends_with('$') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = group.split('}').next().unwrap_or("");
            names.extend(inside.split(',').filter_map(|p| p.trim().split("::").next()).map(str::to_string));
        } else {
            names.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// No module of any crate imports a module that imports it back (the crates' top-level
/// modules, through `crate::` and a child's `super::`).
#[test]
fn no_module_of_any_crate_imports_one_that_imports_it_back() {
    let mut checked = 0;
    for src in crate_sources() {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in sources(&src) {
            let from = module_of(&src, &file);
            if from == "lib" || from == "main" {
                continue;
            }
            let text = read(&file);
            let mut targets = crate_references(&text);
            // A top-level file's `super::x` is the crate's `x` (deeper files' `super::` stays
            // inside their own top-level module).
            if file.parent() == Some(src.as_path()) {
                for (i, _) in text.match_indices("super::") {
                    let name: String = text[i + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    targets.insert(name);
                }
            }
            targets.retain(|t| *t != from && (src.join(format!("{t}.rs")).exists() || src.join(t).is_dir()));
            edges.entry(from).or_default().extend(targets);
        }
        if let Some(cycle) = find_cycle(&edges) {
            panic!("{}: an import cycle: {}", src.display(), cycle.join(" → "));
        }
        checked += 1;
    }
    assert!(checked >= 16, "{checked} crates");
}

/// A crate's `lib.rs` is its face: modules, re-exports and the crate's docs. Nothing another
/// module of the crate imports is defined there (shared pieces live in a module of their own).
#[test]
fn lib_files_are_faces_not_shared_homes() {
    let mut found = Vec::new();
    for src in crate_sources() {
        let lib = src.join("lib.rs");
        if !lib.exists() {
            continue;
        }
        let text = read(&lib);
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut defined = BTreeSet::new();
        for line in code.lines().map(str::trim_start) {
            let line = line.strip_prefix("pub(crate) ").or_else(|| line.strip_prefix("pub ")).unwrap_or(line);
            for kind in ["fn ", "struct ", "enum ", "const ", "static ", "type ", "trait ", "async fn "] {
                if let Some(rest) = line.strip_prefix(kind) {
                    defined.insert(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>());
                }
            }
        }
        for file in sources(&src).into_iter().filter(|f| *f != lib) {
            let used: Vec<String> = crate_references(&read(&file)).intersection(&defined).cloned().collect();
            if !used.is_empty() {
                found.push(format!("{} imports {used:?}, defined in {}", file.display(), lib.display()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A cycle in `edges`, if there is one (depth-first search).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|module| visit(module, edges, &mut Vec::new(), &mut done))
}

/// The cycle check sees a cycle where there is one.
#[test]
fn the_cycle_check_finds_a_cycle() {
    let edge = |a: &str, b: &[&str]| (a.to_string(), b.iter().map(|s| s.to_string()).collect());
    let acyclic = BTreeMap::from([edge("a", &["b"]), edge("b", &["c"])]);
    assert_eq!(find_cycle(&acyclic), None);
    let cyclic = BTreeMap::from([edge("a", &["b"]), edge("b", &["c"]), edge("c", &["a"])]);
    assert_eq!(find_cycle(&cyclic), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

#[test]
fn comments_point_only_at_documents_in_the_repository() {
    let root = root();
    let mut files = Vec::new();
    for dir in
        ["luts", "worker-api", "shaders", "backends", "node", "signaling", "tui/src", "harness/src", "cli/src", "tests"]
    {
        files.extend(
            sources(&root.join(dir)).into_iter().filter(|f| !f.components().any(|c| c.as_os_str() == "target")),
        );
    }
    for file in files {
        for (number, line) in read(&file).lines().enumerate() {
            let Some((_, comment)) = line.split_once("//") else { continue };
            for word in comment.split(|c: char| c.is_whitespace() || "`()[],;:".contains(c)) {
                let word = word.trim_end_matches('.');
                if word.ends_with(".md") {
                    let name = word.rsplit('/').next().unwrap_or(word);
                    let exists = root.join(word).exists() || root.join("docs").join(name).exists();
                    assert!(exists, "{}:{}: `{word}` is not in the repository", file.display(), number + 1);
                }
            }
            let lower = comment.to_lowercase();
            for ticket in ["issue ", "ticket ", "jira"] {
                let pointed = lower
                    .match_indices(ticket)
                    .any(|(i, t)| lower[i + t.len()..].starts_with(|c: char| c.is_ascii_digit() || c == '#'));
                assert!(!pointed, "{}:{}: a comment points at a ticket: {line}", file.display(), number + 1);
            }
        }
    }
}

#[test]
fn every_file_the_architecture_names_exists() {
    let root = root();
    let mut all: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            if path.is_dir() && !name.starts_with('.') && name != "target" {
                stack.push(path);
            } else if path.is_file() {
                all.push(path.strip_prefix(&root).expect("under the root").to_path_buf());
            }
        }
    }
    let text = read(&root.join("docs/ARCHITECTURE.md"));
    let named: BTreeSet<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| [".rs", ".wgsl", ".md", ".py", ".bin", ".js"].iter().any(|x| t.ends_with(x)))
        .filter(|t| !t.contains(' ') && !t.contains('*'))
        .collect();
    assert!(named.len() > 20, "{named:?}");
    for name in named {
        let found = all.iter().any(|p| p.ends_with(name) || p.to_string_lossy().ends_with(name));
        assert!(found, "docs/ARCHITECTURE.md names `{name}`, which is not in the repository");
    }
}

/// Names the page may use that no code of this repository defines: other projects' types and
/// instructions it explains ours by.
const NAMED_ELSEWHERE: &[&str] = &["RawNode", "OpCooperativeMatrixMulAddKHR", "TestBackend", "PASSTHROUGH_SHADERS"];

/// The code of every source file in the repository (`.rs` comments dropped), for
/// [`every_name_the_architecture_uses_is_in_the_code`].
fn all_code() -> String {
    let root = root();
    let mut code = String::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let kind = path.extension().map(|x| x.to_string_lossy().to_string()).unwrap_or_default();
            if path.is_dir() && !name.starts_with('.') && name != "target" {
                stack.push(path);
            } else if kind == "rs" {
                for line in read(&path).lines() {
                    code.push_str(line.split("//").next().unwrap_or(""));
                    code.push('\n');
                }
            } else if ["wgsl", "py", "js", "h", "c", "sh", "html"].contains(&kind.as_str()) {
                code.push_str(&read(&path));
            }
        }
    }
    code
}

/// Whether `word` occurs in `code` as a whole identifier.
fn mentions(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(i, _)| !code[..i].ends_with(ident) && !code[i + word.len()..].starts_with(ident))
}

/// The types, functions and paths the page names in backquotes are in the code: a type
/// (`Contributions`), a path (`Session::take_committed`, `sync::reduce`) segment by segment, a
/// function or other name with an underscore (`run_reference`). A renamed or deleted item makes
/// the page false; this makes the build say so.
#[test]
fn every_name_the_architecture_uses_is_in_the_code() {
    let code = all_code();
    let text = read(&root().join("docs/ARCHITECTURE.md"));
    let identifier = |t: &str| {
        t.starts_with(|c: char| c.is_ascii_alphabetic()) && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut missing = BTreeSet::new();
    let mut checked = 0;
    for token in text.split('`').skip(1).step_by(2) {
        let token = token.trim_end_matches("()");
        let segments: Vec<&str> = token.split("::").collect();
        if !segments.iter().all(|s| identifier(s)) || NAMED_ELSEWHERE.contains(&token) {
            continue;
        }
        let camel =
            |s: &str| s.starts_with(|c: char| c.is_ascii_uppercase()) && s.contains(|c: char| c.is_ascii_lowercase());
        let named = segments.len() > 1
            || camel(token)
            || (token.contains('_') && token.contains(|c: char| c.is_ascii_lowercase()));
        if !named {
            continue;
        }
        checked += 1;
        for segment in segments {
            if !mentions(&code, segment) {
                missing.insert(format!("`{token}` ({segment})"));
            }
        }
    }
    assert!(checked > 100, "{checked} names checked");
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md names what no code has: {missing:?}");
}
