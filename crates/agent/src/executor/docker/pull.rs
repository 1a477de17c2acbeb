//! Pulling an image an instance needs and the node lacks, in the background so that the
//! agent's sync loop goes on: its progress (layers, bytes) for the control plane, a few lines
//! of it for the instance's log, and the registry's own words when it fails. Once pulled, the
//! instance is started as any other; its pull's lines go with its container (a label) so
//! that its log keeps them after an agent restart.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::models::CreateImageInfo;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;
use gpurent_types::agent::{Assignment, PullProgress};

use super::DockerExecutor;
use crate::executor::Bind;

/// The label that keeps a container's pull lines (the start of its log).
pub const LABEL_PULL_LOG: &str = "io.gpurent.pull-log";
/// The label that keeps the final figures of a container's pull (JSON `PullProgress`).
pub const LABEL_PULL: &str = "io.gpurent.pull";
/// At most one progress line in the log this often.
const LINE_EVERY: Duration = Duration::from_secs(2);
/// A pull whose registry sends nothing this long fails (a stalled connection).
const STALLED: Duration = Duration::from_secs(300);
/// The longest a pull may take in all.
const PULL_AT_MOST: Duration = Duration::from_secs(6 * 3600);

/// What the Engine said when a pull failed, in the registry's own words.
fn refusal(image: &str, e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerStreamError { error } => {
            format!("cannot pull image {image}: {error}")
        }
        bollard::errors::Error::DockerResponseServerError { message, .. } => {
            format!("cannot pull image {image}: {message}")
        }
        other => format!("cannot pull image {image}: {other}"),
    }
}

impl DockerExecutor {
    /// Pulls the assignment's image in the background, then starts its container; the pull's
    /// progress and failure are the instance's (`list`, `read_output`) meanwhile. A pull of
    /// this epoch under way already is left to go on.
    pub(super) fn pull_then_start(
        &self,
        a: &Assignment,
        volume: Option<&std::path::Path>,
        binds: &[Bind],
        image: &str,
    ) {
        let id = a.reservation_id.clone();
        if !self.pulls.begin(&id, a.epoch, image) {
            return;
        }
        tracing::info!(reservation_id = %id, %image, "pulling the image");
        let this = self.clone();
        let key = id.clone();
        let a = a.clone();
        let volume = volume.map(std::path::Path::to_owned);
        let binds = binds.to_vec();
        let image = image.to_owned();
        let auth = a.registry_auth();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            if let Err(why) = this.pull(&id, &image, auth).await {
                tracing::warn!(reservation_id = %id, %image, %why, "pull failed");
                this.pulls.fail(&id, why);
                this.pulls.tell_ended();
                return;
            }
            let pulled = this.pulls.finish(&id, started.elapsed());
            let log = pulled.as_ref().map(|(log, _)| log.clone());
            tracing::info!(reservation_id = %id, %image, took = ?started.elapsed(), "pulled the image");
            match this
                .create_container(&a, volume.as_deref(), &binds, pulled)
                .await
            {
                Ok(true) => {
                    if let Some(log) = log {
                        this.note_pull_log(super::container_name(&id), log);
                    }
                    this.pulls.done(&id, a.epoch);
                }
                Ok(false) => this.pulls.fail(
                    &id,
                    format!("the image {image} was gone from the node right after its pull"),
                ),
                Err(e) => this.pulls.fail(&id, e.to_string()),
            }
            this.pulls.tell_ended();
        });
        self.pulls.set_task(&key, task.abort_handle());
    }

    /// The Engine's images by `name:tag`, sorted, at most `NODE_IMAGES_MAX`.
    pub(super) async fn image_tags(&self) -> Vec<String> {
        let listed = match self
            .docker
            .list_images(None::<bollard::query_parameters::ListImagesOptions>)
            .await
        {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the Engine's images");
                return Vec::new();
            }
        };
        let mut tags: Vec<String> = listed
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .filter(|t| !t.starts_with("<none>"))
            .collect();
        tags.sort();
        tags.dedup();
        tags.truncate(gpurent_types::agent::NODE_IMAGES_MAX);
        tags
    }

    /// Pulls `image` in the background unless the Engine has it (`--prepull`), saying how it
    /// went in the agent's log.
    pub(super) fn prepull_one(&self, image: &str) {
        let this = self.clone();
        let image = image.to_owned();
        tokio::spawn(async move {
            if this.docker.inspect_image(&image).await.is_ok() {
                tracing::info!(%image, "prepull: the image is here");
                return;
            }
            let started = Instant::now();
            let key = format!("prepull:{image}");
            match this.pull(&key, &image, None).await {
                Ok(()) => {
                    tracing::info!(%image, took = ?started.elapsed(), "prepull: pulled the image")
                }
                Err(why) => tracing::warn!(%image, %why, "prepull: the pull failed"),
            }
        });
    }

    /// Pulls `image`, with its owner's credential for its registry if the assignment carries
    /// one (used for this pull only).
    async fn pull(
        &self,
        id: &str,
        image: &str,
        auth: Option<gpurent_types::agent::RegistryAuth>,
    ) -> Result<(), String> {
        let docker = self.docker.clone().with_timeout(PULL_AT_MOST);
        let options = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let credentials = auth.map(|a| bollard::auth::DockerCredentials {
            username: Some(a.username),
            password: Some(a.password),
            // The default registry by the address the Docker CLI gives it.
            serveraddress: Some(if a.host == gpurent_types::api::DEFAULT_REGISTRY {
                "https://index.docker.io/v1/".to_owned()
            } else {
                a.host
            }),
            ..Default::default()
        });
        let mut stream = docker.create_image(Some(options), None, credentials);
        let mut tally = Tally::default();
        loop {
            match tokio::time::timeout(STALLED, stream.next()).await {
                Err(_) => {
                    return Err(format!(
                        "cannot pull image {image}: the registry sent nothing for {} s",
                        STALLED.as_secs()
                    ))
                }
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(refusal(image, &e)),
                Ok(Some(Ok(info))) => {
                    tally.apply(&info);
                    self.pulls.update(id, tally.progress(image));
                }
            }
        }
    }
}

/// One layer as the Engine reports it.
#[derive(Debug, Default, Clone)]
struct Layer {
    current: u64,
    total: u64,
    done: bool,
}

/// What a pull's events add up to.
#[derive(Debug, Default)]
pub struct Tally {
    layers: BTreeMap<String, Layer>,
}

impl Tally {
    /// Takes one event of the Engine's pull stream.
    pub fn apply(&mut self, info: &CreateImageInfo) {
        let (Some(id), Some(status)) = (&info.id, &info.status) else {
            return;
        };
        let detail = info.progress_detail.as_ref();
        let number = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
        // The tag's own lines ("latest: Pulling from library/x") are not layers.
        let layer_status = [
            "Pulling fs layer",
            "Waiting",
            "Downloading",
            "Verifying Checksum",
            "Download complete",
            "Extracting",
            "Pull complete",
            "Already exists",
        ];
        if !layer_status.contains(&status.as_str()) {
            return;
        }
        let layer = self.layers.entry(id.clone()).or_default();
        match status.as_str() {
            "Downloading" => {
                if let Some(total) = number(detail.and_then(|d| d.total)) {
                    layer.total = total;
                }
                if let Some(current) = number(detail.and_then(|d| d.current)) {
                    layer.current = current;
                }
            }
            "Download complete" | "Verifying Checksum" | "Extracting" => {
                layer.current = layer.total;
            }
            "Pull complete" | "Already exists" => {
                layer.current = layer.total;
                layer.done = true;
            }
            _ => {}
        }
    }

    pub fn progress(&self, image: &str) -> PullProgress {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        PullProgress {
            image: image.to_owned(),
            layers_done: count(self.layers.values().filter(|l| l.done).count()),
            layers_total: count(self.layers.len()),
            bytes_done: self.layers.values().map(|l| l.current).sum(),
            bytes_total: self.layers.values().map(|l| l.total).sum(),
        }
    }
}

/// "3 of 7 layers, 45.2 of 312.0 MB".
pub fn describe(p: &PullProgress) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    format!(
        "{} of {} layers, {:.1} of {:.1} MB",
        p.layers_done,
        p.layers_total,
        mb(p.bytes_done),
        mb(p.bytes_total)
    )
}

/// One reservation's pull.
#[derive(Debug)]
struct Pull {
    epoch: i64,
    progress: PullProgress,
    /// The lines its log shows so far.
    log: String,
    /// Why it failed (then nothing runs; the failure is reported until forgotten).
    failed: Option<String>,
    last_line: Option<Instant>,
    task: Option<tokio::task::AbortHandle>,
}

/// The pulls under way (and failed ones not yet forgotten), by reservation.
#[derive(Debug, Default, Clone)]
pub struct Pulls {
    inner: Arc<Mutex<HashMap<String, Pull>>>,
    /// Told when a pull ends (its container started, or it failed), so that the agent reports
    /// it at once rather than after its long poll.
    ended: Arc<tokio::sync::Notify>,
}

impl Pulls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pull>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts tracking a pull of `image` for the reservation; false when one of this epoch is
    /// tracked already (under way, or failed and not forgotten).
    pub fn begin(&self, id: &str, epoch: i64, image: &str) -> bool {
        let mut pulls = self.lock();
        if pulls.get(id).is_some_and(|p| p.epoch == epoch) {
            return false;
        }
        if let Some(task) = pulls.get(id).and_then(|p| p.task.as_ref()) {
            task.abort();
        }
        pulls.insert(
            id.to_owned(),
            Pull {
                epoch,
                progress: Tally::default().progress(image),
                log: format!("gpurent: pulling image {image}\n"),
                failed: None,
                last_line: None,
                task: None,
            },
        );
        true
    }

    pub fn set_task(&self, id: &str, task: tokio::task::AbortHandle) {
        if let Some(p) = self.lock().get_mut(id) {
            p.task = Some(task);
        }
    }

    /// New progress; a log line now and then.
    pub fn update(&self, id: &str, progress: PullProgress) {
        let mut pulls = self.lock();
        let Some(p) = pulls.get_mut(id) else {
            return;
        };
        if p.last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
            p.last_line = Some(Instant::now());
            p.log.push_str(&format!(
                "gpurent: {}: {}\n",
                progress.image,
                describe(&progress)
            ));
        }
        p.progress = progress;
    }

    /// The pull is done: a last line; its log and final figures to keep with the container.
    pub fn finish(&self, id: &str, took: Duration) -> Option<(String, PullProgress)> {
        let mut pulls = self.lock();
        let p = pulls.get_mut(id)?;
        p.log.push_str(&format!(
            "gpurent: pulled {} ({}) in {:.1} s\n",
            p.progress.image,
            describe(&p.progress),
            took.as_secs_f64()
        ));
        Some((p.log.clone(), p.progress.clone()))
    }

    pub fn fail(&self, id: &str, why: String) {
        if let Some(p) = self.lock().get_mut(id) {
            p.log.push_str(&format!("gpurent: {why}\n"));
            p.failed = Some(why);
            p.task = None;
        }
    }

    /// Waits until a pull ends (one that ended since the last wait counts).
    pub async fn ended(&self) {
        self.ended.notified().await;
    }

    /// Says that a pull ended: its container started, or it failed.
    fn tell_ended(&self) {
        self.ended.notify_one();
    }

    /// The pull's log so far, for the instance's own log while it has no container.
    pub fn log(&self, id: &str) -> Option<String> {
        self.lock().get(id).map(|p| p.log.clone())
    }

    /// Forgets the reservation's pull (of any epoch), stopping it if it is under way.
    pub fn cancel(&self, id: &str) {
        if let Some(p) = self.lock().remove(id) {
            if let Some(task) = p.task {
                task.abort();
            }
        }
    }

    /// Forgets the pull once its container exists.
    pub fn done(&self, id: &str, epoch: i64) {
        let mut pulls = self.lock();
        if pulls.get(id).is_some_and(|p| p.epoch == epoch) {
            pulls.remove(id);
        }
    }

    /// Each pull as the agent sees it: pulling, or failed.
    pub fn observed(&self) -> Vec<(String, i64, Result<PullProgress, String>)> {
        self.lock()
            .iter()
            .map(|(id, p)| {
                let state = match &p.failed {
                    Some(why) => Err(why.clone()),
                    None => Ok(p.progress.clone()),
                };
                (id.clone(), p.epoch, state)
            })
            .collect()
    }

    /// The failed pulls, as outputs kept for their reservation and epoch.
    pub fn failed(&self) -> Vec<(String, i64)> {
        self.lock()
            .iter()
            .filter(|(_, p)| p.failed.is_some())
            .map(|(id, p)| (id.clone(), p.epoch))
            .collect()
    }
}

impl DockerExecutor {
    /// The pull lines a container keeps in its label (empty: its image was there), as `list`
    /// last saw them.
    pub(super) fn pull_log_of(&self, name: &str) -> Option<String> {
        self.pull_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// A container made after a pull: its lines known before `list` sees its label.
    pub(super) fn note_pull_log(&self, name: String, log: String) {
        self.pull_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, log);
    }

    /// Keeps the pull lines of the containers listed (by each of their names).
    pub(super) fn note_pull_logs(&self, containers: &[bollard::models::ContainerSummary]) {
        let mut logs = self.pull_logs.lock().unwrap_or_else(|p| p.into_inner());
        logs.clear();
        for c in containers {
            let Some(log) = c.labels.as_ref().and_then(|l| l.get(LABEL_PULL_LOG)) else {
                continue;
            };
            for name in c.names.iter().flatten() {
                logs.insert(name.trim_start_matches('/').to_owned(), log.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::ProgressDetail;

    fn event(id: &str, status: &str, current: Option<i64>, total: Option<i64>) -> CreateImageInfo {
        CreateImageInfo {
            id: Some(id.to_owned()),
            status: Some(status.to_owned()),
            progress_detail: Some(ProgressDetail { current, total }),
            error_detail: None,
        }
    }

    #[test]
    fn layers_and_bytes_add_up() {
        let mut t = Tally::default();
        t.apply(&event("latest", "Pulling from library/x", None, None));
        t.apply(&event("a", "Pulling fs layer", None, None));
        t.apply(&event("b", "Already exists", None, None));
        t.apply(&event("a", "Downloading", Some(100), Some(1000)));
        let p = t.progress("x");
        assert_eq!((p.layers_done, p.layers_total), (1, 2));
        assert_eq!((p.bytes_done, p.bytes_total), (100, 1000));
        t.apply(&event("a", "Download complete", None, None));
        t.apply(&event("a", "Extracting", Some(5), Some(1000)));
        t.apply(&event("a", "Pull complete", None, None));
        let p = t.progress("x");
        assert_eq!((p.layers_done, p.layers_total), (2, 2));
        assert_eq!((p.bytes_done, p.bytes_total), (1000, 1000));
        assert_eq!(describe(&p), "2 of 2 layers, 0.0 of 0.0 MB");
    }

    #[test]
    fn a_pull_is_tracked_once_per_epoch_and_keeps_its_lines() {
        let pulls = Pulls::default();
        assert!(pulls.begin("r", 1, "img"));
        assert!(!pulls.begin("r", 1, "img"));
        pulls.fail("r", "cannot pull image img: not found".into());
        assert_eq!(pulls.failed(), [("r".to_owned(), 1)]);
        assert!(pulls.log("r").unwrap().ends_with("not found\n"));
        // A new epoch starts over.
        assert!(pulls.begin("r", 2, "img"));
        assert!(pulls.failed().is_empty());
        pulls.done("r", 2);
        assert!(pulls.observed().is_empty());
    }
}
