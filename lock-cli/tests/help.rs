//! What the command says about itself: `--help` compared with committed snapshots, every
//! URL form in the help and the READMEs, shell completions and manual pages generated from
//! the same definitions.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{distlock, finish, Finished, PROMPT};

/// Every subcommand, as `distlock --help` lists them.
const SUBCOMMANDS: [&str; 8] = [
    "run",
    "bench",
    "status",
    "elect",
    "leader",
    "cron",
    "completions",
    "man",
];

async fn distlock_with(args: &[&str]) -> Finished {
    finish(distlock(args), PROMPT).await
}

fn snapshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name)
}

/// A line diff of `old` and `new` (longest common subsequence): `-` lines only in the
/// snapshot, `+` lines only in the output, two lines of context.
fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push(format!("  {}", a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            lines.push(format!("- {}", a[i]));
            i += 1;
        } else {
            lines.push(format!("+ {}", b[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..lines.len())
        .filter(|&k| !lines[k].starts_with("  "))
        .collect();
    let near = |k: usize| changed.iter().any(|&c| c.abs_diff(k) <= 2);
    (0..lines.len())
        .filter(|&k| near(k))
        .map(|k| lines[k].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compares `actual` with the snapshot `name`; `DISTLOCK_UPDATE_SNAPSHOTS=1` rewrites it.
fn assert_snapshot(name: &str, actual: &str) {
    let path = snapshot_path(name);
    if std::env::var_os("DISTLOCK_UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        eprintln!("updated {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from the output (- snapshot, + output):\n{}\n\nIf the change is meant, \
         rewrite the snapshots with:\n  DISTLOCK_UPDATE_SNAPSHOTS=1 cargo test -p lock-cli \
         --test help\nand commit them.",
        path.display(),
        diff(&expected, actual)
    );
}

/// `distlock --help` and `distlock run --help` are exactly the committed snapshots, at
/// most 100 columns wide whatever the terminal's width.
#[tokio::test]
async fn help_matches_the_snapshots() {
    for (args, name) in [
        (&["--help"][..], "distlock-help.txt"),
        (&["run", "--help"], "run-help.txt"),
    ] {
        let out = distlock_with(args).await;
        out.expect_code(0);
        assert_snapshot(name, &out.stdout);
        let longest = out.stdout.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(longest <= 100, "{name}: a line of {longest} columns");
        let mut wide = distlock(args);
        wide.env("COLUMNS", "300");
        let wide = finish(wide, PROMPT).await;
        assert_eq!(wide.stdout, out.stdout, "a wide terminal changed {name}");
    }
}

/// The help and both READMEs name every URL scheme the library connects to.
#[tokio::test]
async fn every_url_form_is_documented() {
    let help = distlock_with(&["--help"]).await;
    help.expect_code(0);
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(manifest.join("README.md")).unwrap();
    let root = std::fs::read_to_string(manifest.join("../README.md")).unwrap();
    for (scheme, _feature) in distlock::SCHEMES {
        let form = format!("{scheme}://");
        assert!(help.stdout.contains(&form), "--help lacks {form}");
        assert!(readme.contains(&form), "lock-cli/README.md lacks {form}");
        assert!(root.contains(&form), "README.md lacks {form}");
    }
    // The TLS and backend parameters.
    for param in [
        "ca=",
        "cert=",
        "key=",
        "tls=true",
        "sentinel_password=",
        "drift=",
        "table=",
    ] {
        assert!(help.stdout.contains(param), "--help lacks {param}");
    }
}

/// Completes `words` (the last one being typed) with bash and the script of
/// `distlock completions bash`; returns the candidates.
async fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let line = words.join(" ");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let quoted = quoted.join(" ");
    let (current, previous) = (words[words.len() - 1], words[words.len() - 2]);
    // Bash calls the function with the command, the word being completed and the one
    // before it.
    let program = format!(
        "source {}; COMP_WORDS=({quoted}); COMP_CWORD={}; COMP_LINE='{line}'; \
         COMP_POINT=${{#COMP_LINE}}; _distlock distlock '{current}' '{previous}'; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words.len() - 1,
    );
    let out = tokio::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("bash runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `distlock completions bash` is a script bash loads, which completes the subcommands and
/// a subcommand's flags; every other shell gets a script too; an unknown shell exits 64.
#[tokio::test]
async fn completions_complete_subcommands_and_flags() {
    let out = distlock_with(&["completions", "bash"]).await;
    out.expect_code(0);
    for sub in SUBCOMMANDS {
        assert!(out.stdout.contains(sub), "the script lacks {sub}");
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("distlock.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let subs = bash_complete(&script, &["distlock", ""]).await;
    for sub in SUBCOMMANDS {
        assert!(subs.iter().any(|s| s == sub), "{sub} not offered: {subs:?}");
    }
    let flags = bash_complete(&script, &["distlock", "run", "--no"]).await;
    assert!(flags.iter().any(|f| f == "--no-wait"), "{flags:?}");
    let flags = bash_complete(&script, &["distlock", "run", "--metrics-t"]).await;
    assert_eq!(flags, ["--metrics-textfile"]);

    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = distlock_with(&["completions", shell]).await;
        out.expect_code(0);
        assert!(
            out.stdout.contains("metrics-textfile"),
            "{shell}: {}",
            out.stdout
        );
    }
    distlock_with(&["completions", "tcsh"])
        .await
        .expect_code(64);
}

/// Checks `page` with groff (warnings are errors) and returns it as plain text, lines
/// long enough that nothing is hyphenated, spaces collapsed.
async fn render_man(page: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("groff")
        .args(["-man", "-ww", "-Tascii", "-P-cbou", "-rLL=1000n"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("groff (install it with: sudo apt-get install -y groff-base)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(page.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "groff failed: {out:?}");
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.is_empty(), "groff warns: {warnings}\n{page}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `distlock man` is a roff page groff reads without a warning, naming every subcommand;
/// `distlock man run` is distlock-run(1) with run's flags; an unknown subcommand exits 64.
#[tokio::test]
async fn man_pages_are_valid_roff() {
    let out = distlock_with(&["man"]).await;
    out.expect_code(0);
    assert!(
        out.stdout.starts_with(".ie \\n(.g .ds Aq"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(".TH distlock 1"), "{}", out.stdout);
    let text = render_man(&out.stdout).await;
    for sub in SUBCOMMANDS {
        // Each subcommand is listed with its own page, which `distlock man SUB` prints.
        assert!(
            text.contains(&format!("distlock-{sub}(1)")),
            "the page lacks {sub}: {text}"
        );
    }
    assert!(text.contains("SUBCOMMANDS"), "{text}");

    let run = distlock_with(&["man", "run"]).await;
    run.expect_code(0);
    assert!(run.stdout.contains(".TH distlock-run 1"), "{}", run.stdout);
    let text = render_man(&run.stdout).await;
    for flag in ["no-wait", "metrics-textfile", "DISTLOCK_TTL"] {
        assert!(text.contains(flag), "distlock-run(1) lacks {flag}: {text}");
    }

    distlock_with(&["man", "nonsense"])
        .await
        .expect_code(64)
        .expect_stderr("no subcommand \"nonsense\"");
}
