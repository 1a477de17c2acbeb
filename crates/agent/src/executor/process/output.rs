//! An instance's output: `output.log` in its directory while it runs, kept beside the
//! instance directories after a stop (the agent's alone) until the agent has shipped it.

use std::path::PathBuf;

use super::{set_mode, InstanceFile, ProcessExecutor};

impl ProcessExecutor {
    /// The instance's output, for logs.
    pub fn output_path(&self, id: &str) -> PathBuf {
        self.instance_dir(id).join("output.log")
    }

    /// Where a stop keeps the output of the instance of this epoch: beside the instance
    /// directories, outside what any instance sees.
    pub(super) fn kept_path(&self, id: &str, epoch: i64) -> PathBuf {
        self.dir.join(format!("{id}.{epoch}.log"))
    }

    /// The outputs stops kept: (reservation, epoch, file).
    pub(super) fn kept(&self) -> Vec<(String, i64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let (id, epoch) = name.strip_suffix(".log")?.rsplit_once('.')?;
                Some((id.to_owned(), epoch.parse().ok()?, e.path()))
            })
            .collect()
    }

    /// The output of the reservation's instance: its live one, else the one its stop kept.
    pub(super) fn output_file(&self, id: &str) -> std::io::Result<std::fs::File> {
        match std::fs::File::open(self.output_path(id)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match self.kept().into_iter().find(|(r, _, _)| r == id) {
                    Some((_, _, path)) => std::fs::File::open(path),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// Keeps the output of a stopped instance (its processes are all gone: none writes to it
    /// any more) outside its directory, in place of what an earlier stop kept.
    pub(super) fn keep_output(&self, f: &InstanceFile) {
        let id = &f.reservation_id;
        let output = self.output_path(id);
        if !output.exists() {
            return;
        }
        for (_, _, path) in self.kept().into_iter().filter(|(r, _, _)| r == id) {
            let _ = std::fs::remove_file(path);
        }
        let kept = self.kept_path(id, f.epoch);
        // The agent's alone (it always was: the instance only ever had an open descriptor).
        if let Err(e) = std::fs::rename(&output, &kept).and_then(|()| set_mode(&kept, 0o600)) {
            tracing::warn!(reservation_id = %id, error = %e, "cannot keep the output of a stopped instance; what it wrote since the last sync is lost");
        }
    }
}
