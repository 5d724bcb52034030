//! GPU health from `nvidia-smi --query-gpu`: the node agent reads each GPU's cumulative ECC counters and
//! temperature every interval and reports them to the collector's `NodeHealthService`, which judges nodes on them
//! (docs/concepts.md, "Suspect nodes"). XID errors are not in `--query-gpu`'s output; they stay empty here.

use startline_proto::pb;
use std::path::Path;
use std::time::Duration;

/// The fields asked for, in this order.
pub const QUERY: &str =
    "index,uuid,ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,temperature.gpu";

/// Why a reading failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The command could not run or failed.
    #[error("nvidia-smi: {0}")]
    Command(String),
    /// Its output was not what `--format=csv,noheader,nounits` prints.
    #[error("nvidia-smi output line {line}: {reason}")]
    Parse { line: usize, reason: String },
}

/// A counter or reading: `[N/A]`, `N/A` and `[Not Supported]` are absent.
fn field<T: std::str::FromStr>(s: &str) -> Result<Option<T>, String> {
    let s = s.trim();
    if s.is_empty() || s.contains("N/A") || s.contains("Not Supported") {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| format!("{s:?} is not a number"))
}

/// Parses `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` output.
pub fn parse(out: &str) -> Result<Vec<pb::GpuHealth>, GpuError> {
    let mut gpus = Vec::new();
    for (i, line) in out.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |reason: String| GpuError::Parse { line: i + 1, reason };
        let cols: Vec<&str> = line.split(',').collect();
        if cols.len() != 5 {
            return Err(bad(format!("{} columns where 5 were asked for", cols.len())));
        }
        gpus.push(pb::GpuHealth {
            index: field(cols[0]).map_err(bad)?.ok_or_else(|| bad("no GPU index".into()))?,
            uuid: cols[1].trim().chars().take(128).collect(),
            ecc_corrected: field(cols[2]).map_err(bad)?,
            ecc_uncorrected: field(cols[3]).map_err(bad)?,
            xid_errors: Vec::new(),
            temperature_c: field(cols[4]).map_err(bad)?,
        });
    }
    Ok(gpus)
}

/// Runs `nvidia_smi` (10 s at most) and parses its output.
pub async fn read(nvidia_smi: &Path) -> Result<Vec<pb::GpuHealth>, GpuError> {
    let run = tokio::process::Command::new(nvidia_smi)
        .arg(format!("--query-gpu={QUERY}"))
        .arg("--format=csv,noheader,nounits")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .map_err(|_| GpuError::Command("no answer within 10 s".into()))?
        .map_err(|e| GpuError::Command(format!("{}: {e}", nvidia_smi.display())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(GpuError::Command(format!("exit {}: {}", out.status, err.trim())));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_and_treats_not_available_as_absent() {
        let out = "0, GPU-aaaa, 12, 0, 41\n1, GPU-bbbb, [N/A], [N/A], 39\n\n2, GPU-cccc, 7, 1, [Not Supported]\n";
        let g = parse(out).expect("parses");
        assert_eq!(g.len(), 3);
        assert_eq!(
            (g[0].index, g[0].uuid.as_str(), g[0].ecc_corrected, g[0].ecc_uncorrected),
            (0, "GPU-aaaa", Some(12), Some(0))
        );
        assert_eq!(g[0].temperature_c, Some(41.0));
        assert_eq!((g[1].ecc_corrected, g[1].ecc_uncorrected), (None, None));
        assert_eq!((g[2].ecc_uncorrected, g[2].temperature_c), (Some(1), None));
        let e = parse("0, GPU-a, 1, 2").expect_err("4 columns");
        assert!(e.to_string().contains("line 1") && e.to_string().contains("4 columns"), "{e}");
        let e = parse("0, GPU-a, many, 2, 3").expect_err("not a number");
        assert!(e.to_string().contains("\"many\""), "{e}");
    }
}
