//! The benchmark's progress: a bar over the whole run on a terminal, and waiting for the
//! tasks of one run while it moves.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;

use crate::exit::{CliError, INTERNAL};

/// A bar over the time of `runs` runs of `duration` each, on a terminal only.
pub fn progress_bar(duration: Duration, runs: usize) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let total = duration.as_millis() as u64 * runs as u64;
    let pb = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
    {
        pb.set_style(style);
    }
    Some(pb)
}

/// Waits for every task of a run that started at `started` for `duration`, moving the
/// progress bar along meanwhile.
///
/// # Errors
/// A task panicked (a bug).
pub async fn join_tasks<T: 'static>(
    mut set: JoinSet<T>,
    started: Instant,
    duration: Duration,
    progress: Option<&ProgressBar>,
) -> Result<Vec<T>, CliError> {
    let base = progress.map_or(0, |pb| pb.position());
    let mut done = Vec::with_capacity(set.len());
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            joined = set.join_next() => match joined {
                Some(Ok(stats)) => done.push(stats),
                Some(Err(e)) => {
                    return Err(CliError::new(INTERNAL, format!("a benchmark task failed: {e}")))
                }
                None => break,
            },
            _ = tick.tick(), if progress.is_some() => {
                if let Some(pb) = progress {
                    let elapsed = started.elapsed().min(duration).as_millis() as u64;
                    pb.set_position(base + elapsed);
                }
            }
        }
    }
    if let Some(pb) = progress {
        pb.set_position(base + duration.as_millis() as u64);
    }
    Ok(done)
}
