//! The images the node's Engine has, reported to the control plane when they change (placement
//! prefers a node that has a reservation's image), looked at every half minute at most.

use std::time::Duration;

use tokio::time::Instant;

use crate::executor::Executor;

/// How often the Engine's images are listed.
const LOOK_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub(crate) struct ImageReports {
    /// What the control plane has (its last answered sync carried it).
    delivered: Option<Vec<String>>,
    looked: Option<Instant>,
}

impl ImageReports {
    /// The images to send with this sync: the Engine's, when it is time to look and they
    /// differ from what the control plane has.
    pub async fn due(&mut self, executor: &dyn Executor) -> Option<Vec<String>> {
        if !executor.runs_containers() || self.looked.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return None;
        }
        self.looked = Some(Instant::now());
        let now = executor.images().await;
        (self.delivered.as_ref() != Some(&now)).then_some(now)
    }

    /// The sync that carried `images` was answered.
    pub fn delivered(&mut self, images: Option<Vec<String>>) {
        if images.is_some() {
            self.delivered = images;
        }
    }
}
