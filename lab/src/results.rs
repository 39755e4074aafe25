//! Each scenario's results on disk: its `Results` as pretty JSON (`SCENARIO.json` under the
//! run's --out), read back into the same type by the documents, so that a field renamed or
//! retyped shows at compile time instead of as an empty cell.

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What every scenario's results begin with: the scenario, whether it was the quick
/// variant, the command that ran it and its parameters. Flattened into each `Results`, so
/// that the JSON keeps these four keys first, as it always had them.
#[derive(Serialize, Deserialize)]
pub struct Run<P> {
    pub scenario: String,
    pub quick: bool,
    pub command: String,
    pub params: P,
}

impl<P> Run<P> {
    pub fn new(scenario: &str, quick: bool, command: String, params: P) -> Self {
        Run {
            scenario: scenario.into(),
            quick,
            command,
            params,
        }
    }

    /// The head of the scenario's own document (`doc::head`); `quick`: what the quick
    /// variant leaves out, said when this run was one.
    pub fn doc_head(&self, title: &str, quick: &str) -> String {
        crate::doc::head(
            title,
            &self.scenario,
            &self.command,
            self.quick.then_some(quick),
        )
    }
}

/// Writes `results` to `dir/file`, creating `dir`.
pub fn save<T: Serialize>(dir: &Path, file: &str, results: &T) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file);
    std::fs::write(&path, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `dir/{scenario}.json` (the whole results) and `dir/{scenario}.csv`: `header`,
/// then one line per row; the scenarios' spreadsheets all come out this way.
pub fn save_with_csv<T: Serialize>(
    dir: &Path,
    scenario: &str,
    results: &T,
    header: &str,
    lines: impl IntoIterator<Item = String>,
) -> Result<()> {
    save(dir, &format!("{scenario}.json"), results)?;
    let mut csv = format!("{header}\n");
    for line in lines {
        csv += &line;
        csv.push('\n');
    }
    let path = dir.join(format!("{scenario}.csv"));
    std::fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
}

/// Reads `dir/file` back.
pub fn load<T: DeserializeOwned>(dir: &Path, file: &str) -> Result<T> {
    let path = dir.join(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The JSON files under `dir`, at any depth.
    fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                json_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }

    /// Every committed scenario result, the oldest included, still reads into its type: the
    /// documents are drawn from them.
    #[test]
    fn committed_results_load() {
        let mut files = Vec::new();
        json_files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("results"),
            &mut files,
        );
        let mut loaded = 0;
        for f in &files {
            let dir = f.parent().unwrap();
            let name = f.file_name().unwrap().to_str().unwrap();
            let r = match name {
                "r0.json" => crate::r0::load(dir).map(drop),
                "r1.json" => crate::r1::load(dir).map(drop),
                "r2.json" => crate::r2::load(dir).map(drop),
                "r3.json" => crate::r3::load(dir).map(drop),
                "r4.json" => crate::r4::load(dir).map(drop),
                "rtt.json" => crate::rtt::load(dir).map(drop),
                "login.json" => crate::login::load(dir).map(drop),
                "dr.json" => crate::dr::load(dir).map(drop),
                // Other JSON (path caches, coordinator logs) is no scenario's results.
                _ => continue,
            };
            r.unwrap_or_else(|e| panic!("{e:#}"));
            loaded += 1;
        }
        assert!(loaded >= 20, "only {loaded} result files found");
    }
}
