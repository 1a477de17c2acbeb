//! Elastic capacity: from the fleet's figures, one evaluation at a time, when to ask for more
//! nodes (scale-out) or fewer (scale-in). Pure (the time is an argument), so its rules are
//! property-tested; the control plane reads the figures and runs the hook (`server/src/jobs/elastic.rs`).
//! It lives here beside placement and the queue because it is one more scheduling decision over
//! the same capacity, with the same needs: no I/O, deterministic, property-tested.
//!
//! The GPU figure the rules use is the **allocation** (GPU memory held by reservations over the
//! live nodes' total), not the utilisation: allocation is what turns tenants away, while an
//! allocated GPU whose tenant is idle still cannot be rented. The utilisation is reported with
//! the figures for the hook's information.

use std::collections::VecDeque;

/// The fleet as one evaluation sees it; also what the scale hook receives (`figures` of its
/// JSON, the README's contract), so its fields' names are part of that contract.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Figures {
    /// Nodes heard from recently.
    pub live_nodes: u32,
    /// GPUs of the live nodes.
    pub gpus: u32,
    /// GPU memory held by reservations over the live nodes' total, in percent (0 without GPUs).
    pub gpu_allocation_pct: f64,
    /// Mean GPU utilisation of the live nodes' GPUs in their last telemetry; `None` without any.
    pub gpu_utilization_pct: Option<f64>,
    /// Mean CPU utilisation of the live nodes that report it; `None` when none does.
    pub cpu_utilization_pct: Option<f64>,
    /// Reservations waiting in the queue.
    pub queued: u32,
    /// How long the oldest of them has waited, in seconds.
    pub oldest_queued_s: Option<u64>,
}

/// The rules' thresholds; the defaults are the seeds' (scale out above 70% CPU and 85% GPU).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElasticConfig {
    /// Scale out when CPU is above this and GPU allocation above `out_gpu_pct` ...
    pub out_cpu_pct: f64,
    pub out_gpu_pct: f64,
    /// ... for this many consecutive evaluations.
    pub out_window: u32,
    /// Or when a reservation has been queued longer than this many seconds.
    pub queue_wait_s: u64,
    /// Scale in when GPU allocation is below `in_gpu_pct` and CPU below `in_cpu_pct` ...
    pub in_gpu_pct: f64,
    pub in_cpu_pct: f64,
    /// ... for this many consecutive evaluations, nothing is queued, and more than
    /// `min_nodes` nodes are live.
    pub in_window: u32,
    pub min_nodes: u32,
    /// No action at all for this long after a scale-out (a new node takes minutes to join and
    /// the figures meanwhile do not show it) ...
    pub out_cooldown_s: u64,
    /// ... or after a scale-in.
    pub in_cooldown_s: u64,
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig {
            out_cpu_pct: 70.0,
            out_gpu_pct: 85.0,
            out_window: 3,
            queue_wait_s: 60,
            in_gpu_pct: 30.0,
            in_cpu_pct: 30.0,
            in_window: 10,
            min_nodes: 1,
            out_cooldown_s: 300,
            in_cooldown_s: 900,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    ScaleOut,
    ScaleIn,
}

impl ActionKind {
    /// `scale-out` or `scale-in`, as the hook receives it.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::ScaleOut => "scale-out",
            ActionKind::ScaleIn => "scale-in",
        }
    }
}

/// The rule that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// CPU and GPU allocation above their thresholds over the scale-out window.
    Busy,
    /// A reservation queued longer than the limit.
    QueueWait,
    /// GPU allocation and CPU below their thresholds over the scale-in window.
    Idle,
}

impl Rule {
    /// A stable snake_case name for the hook.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Busy => "busy",
            Rule::QueueWait => "queue_wait",
            Rule::Idle => "idle",
        }
    }
}

/// What the policy asks of the hook.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    pub kind: ActionKind,
    pub rule: Rule,
    /// The rule and its figures, in words.
    pub reason: String,
    /// The figures of the evaluation that fired.
    pub figures: Figures,
    /// When it was decided (the `now` it was evaluated at).
    pub at_s: i64,
}

/// The policy and its memory: the last evaluations' figures and the last action.
#[derive(Debug, Clone)]
pub struct Elastic {
    config: ElasticConfig,
    history: VecDeque<Figures>,
    last: Option<(ActionKind, i64)>,
}

impl Elastic {
    pub fn new(config: ElasticConfig) -> Self {
        Elastic {
            config,
            history: VecDeque::new(),
            last: None,
        }
    }

    pub fn config(&self) -> &ElasticConfig {
        &self.config
    }

    /// Whether an action at `now_s` (unix seconds) would fall in the last action's cooldown.
    pub fn cooling_down(&self, now_s: i64) -> bool {
        self.last.is_some_and(|(kind, at)| {
            let cooldown = match kind {
                ActionKind::ScaleOut => self.config.out_cooldown_s,
                ActionKind::ScaleIn => self.config.in_cooldown_s,
            };
            now_s < at.saturating_add(i64::try_from(cooldown).unwrap_or(i64::MAX))
        })
    }

    /// One evaluation: records the figures and returns the action they call for, if any.
    /// An action starts its cooldown; scale-out is considered before scale-in, so there is
    /// never both.
    pub fn evaluate(&mut self, now_s: i64, figures: Figures) -> Option<Action> {
        let keep = self.config.out_window.max(self.config.in_window).max(1) as usize;
        self.history.push_back(figures);
        while self.history.len() > keep {
            self.history.pop_front();
        }
        if self.cooling_down(now_s) {
            return None;
        }
        let action = self.decide(now_s)?;
        self.last = Some((action.kind, now_s));
        Some(action)
    }

    /// The hook could not deliver the action decided at `at_s`: its cooldown is lifted, so the
    /// next evaluation asks again if the rule still holds. (Only an action out of any cooldown
    /// is ever decided, so lifting it leaves no earlier cooldown cut short.)
    pub fn undelivered(&mut self, kind: ActionKind, at_s: i64) {
        if self.last == Some((kind, at_s)) {
            self.last = None;
        }
    }

    fn decide(&self, now_s: i64) -> Option<Action> {
        let c = &self.config;
        let current = self.history.back()?.clone();
        if let Some(n) = held(&self.history, c.out_window, |f| busy(c, f)) {
            let reason = format!(
                "busy: CPU {} > {}% and GPU allocation {:.1}% > {}% for {n} evaluations",
                pct(current.cpu_utilization_pct),
                c.out_cpu_pct,
                current.gpu_allocation_pct,
                c.out_gpu_pct
            );
            return Some(action(
                ActionKind::ScaleOut,
                Rule::Busy,
                reason,
                current,
                now_s,
            ));
        }
        if let Some(waited) = current.oldest_queued_s.filter(|w| *w > c.queue_wait_s) {
            let reason = format!(
                "queue_wait: {} reservation(s) queued, the oldest for {waited} s > {} s",
                current.queued, c.queue_wait_s
            );
            return Some(action(
                ActionKind::ScaleOut,
                Rule::QueueWait,
                reason,
                current,
                now_s,
            ));
        }
        if current.live_nodes > c.min_nodes && current.queued == 0 {
            if let Some(n) = held(&self.history, c.in_window, |f| idle(c, f)) {
                let reason = format!(
                    "idle: GPU allocation {:.1}% < {}% and CPU {} < {}% for {n} evaluations, \
                     {} live nodes > {}",
                    current.gpu_allocation_pct,
                    c.in_gpu_pct,
                    pct(current.cpu_utilization_pct),
                    c.in_cpu_pct,
                    current.live_nodes,
                    c.min_nodes
                );
                return Some(action(
                    ActionKind::ScaleIn,
                    Rule::Idle,
                    reason,
                    current,
                    now_s,
                ));
            }
        }
        None
    }
}

fn action(kind: ActionKind, rule: Rule, reason: String, figures: Figures, at_s: i64) -> Action {
    Action {
        kind,
        rule,
        reason,
        figures,
        at_s,
    }
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), |v| format!("{v:.1}%"))
}

/// Scale-out's condition on one evaluation. An unknown CPU figure (no node reports it) never
/// satisfies a rule: the policy acts on what it knows.
pub fn busy(c: &ElasticConfig, f: &Figures) -> bool {
    f.cpu_utilization_pct.is_some_and(|cpu| cpu > c.out_cpu_pct)
        && f.gpu_allocation_pct > c.out_gpu_pct
}

/// Scale-in's condition on one evaluation (the node count and the queue aside).
pub fn idle(c: &ElasticConfig, f: &Figures) -> bool {
    f.cpu_utilization_pct.is_some_and(|cpu| cpu < c.in_cpu_pct)
        && f.gpu_allocation_pct < c.in_gpu_pct
}

/// The window's length when the last `window` evaluations (at least one) all satisfy `rule`.
fn held(history: &VecDeque<Figures>, window: u32, rule: impl Fn(&Figures) -> bool) -> Option<u32> {
    let window = window.max(1);
    let n = window as usize;
    (history.len() >= n && history.iter().rev().take(n).all(rule)).then_some(window)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn figures(nodes: u32, gpu: f64, cpu: Option<f64>) -> Figures {
        Figures {
            live_nodes: nodes,
            gpus: nodes * 4,
            gpu_allocation_pct: gpu,
            gpu_utilization_pct: None,
            cpu_utilization_pct: cpu,
            queued: 0,
            oldest_queued_s: None,
        }
    }

    #[test]
    fn scales_out_after_three_busy_evaluations_then_cools_down() {
        let mut e = Elastic::new(ElasticConfig::default());
        let busy = figures(2, 90.0, Some(80.0));
        assert_eq!(e.evaluate(0, busy.clone()), None);
        assert_eq!(e.evaluate(60, busy.clone()), None);
        let a = e
            .evaluate(120, busy.clone())
            .map(|a| (a.kind, a.rule, a.reason));
        assert_eq!(
            a,
            Some((
                ActionKind::ScaleOut,
                Rule::Busy,
                "busy: CPU 80.0% > 70% and GPU allocation 90.0% > 85% for 3 evaluations".to_owned()
            ))
        );
        // Within the 5-minute cooldown: nothing; after it, again.
        assert_eq!(e.evaluate(180, busy.clone()), None);
        assert_eq!(e.evaluate(419, busy.clone()), None);
        assert!(e.evaluate(420, busy).is_some());
    }

    #[test]
    fn one_quiet_evaluation_restarts_the_window() {
        let mut e = Elastic::new(ElasticConfig::default());
        let busy = figures(2, 90.0, Some(80.0));
        e.evaluate(0, busy.clone());
        e.evaluate(1, busy.clone());
        assert_eq!(e.evaluate(2, figures(2, 90.0, Some(60.0))), None);
        assert_eq!(e.evaluate(3, busy.clone()), None);
        assert_eq!(e.evaluate(4, busy.clone()), None);
        assert!(e.evaluate(5, busy).is_some());
    }

    #[test]
    fn gpu_alone_or_unknown_cpu_is_not_busy() {
        let mut e = Elastic::new(ElasticConfig::default());
        for t in 0..10 {
            assert_eq!(e.evaluate(t, figures(2, 100.0, None)), None);
            assert_eq!(e.evaluate(t, figures(2, 100.0, Some(70.0))), None);
        }
    }

    #[test]
    fn a_long_queue_scales_out_at_once() {
        let mut e = Elastic::new(ElasticConfig::default());
        let mut f = figures(1, 50.0, Some(10.0));
        f.queued = 2;
        f.oldest_queued_s = Some(60);
        assert_eq!(
            e.evaluate(0, f.clone()),
            None,
            "60 s is not longer than 60 s"
        );
        f.oldest_queued_s = Some(61);
        let a = e.evaluate(1, f);
        assert_eq!(
            a.map(|a| (a.kind, a.rule, a.reason)),
            Some((
                ActionKind::ScaleOut,
                Rule::QueueWait,
                "queue_wait: 2 reservation(s) queued, the oldest for 61 s > 60 s".to_owned()
            ))
        );
    }

    #[test]
    fn scales_in_after_ten_idle_evaluations_above_min_nodes() {
        let mut e = Elastic::new(ElasticConfig::default());
        for t in 0..9 {
            assert_eq!(e.evaluate(t * 60, figures(3, 10.0, Some(5.0))), None);
        }
        let a = e.evaluate(540, figures(3, 10.0, Some(5.0)));
        assert_eq!(
            a.as_ref().map(|a| (a.kind, a.rule)),
            Some((ActionKind::ScaleIn, Rule::Idle))
        );
        // 15 minutes of cooldown.
        assert_eq!(e.evaluate(540 + 899, figures(3, 10.0, Some(5.0))), None);
        assert!(e.evaluate(540 + 900, figures(3, 10.0, Some(5.0))).is_some());
        // At min_nodes, never.
        let mut e = Elastic::new(ElasticConfig::default());
        for t in 0..20 {
            assert_eq!(e.evaluate(t, figures(1, 0.0, Some(0.0))), None);
        }
    }

    #[test]
    fn an_undelivered_action_is_asked_again_while_its_rule_holds() {
        let mut e = Elastic::new(ElasticConfig {
            out_window: 1,
            ..ElasticConfig::default()
        });
        let busy = figures(2, 90.0, Some(80.0));
        let first = e.evaluate(0, busy.clone());
        assert!(first.is_some());
        e.undelivered(ActionKind::ScaleOut, 0);
        assert_eq!(e.evaluate(60, figures(2, 50.0, Some(80.0))), None);
        assert!(e.evaluate(120, busy).is_some());
    }

    fn arb_figures() -> impl Strategy<Value = Figures> {
        (
            0u32..5,
            0.0f64..100.0,
            proptest::option::weighted(0.9, 0.0f64..100.0),
            0u32..3,
            0u64..200,
        )
            .prop_map(|(nodes, gpu, cpu, queued, wait)| Figures {
                live_nodes: nodes,
                gpus: nodes * 2,
                gpu_allocation_pct: gpu,
                gpu_utilization_pct: None,
                cpu_utilization_pct: cpu,
                queued,
                oldest_queued_s: (queued > 0).then_some(wait),
            })
    }

    fn arb_config() -> impl Strategy<Value = ElasticConfig> {
        (1u32..5, 1u32..8, 0u32..4, 0u64..400, 0u64..900).prop_map(
            |(out_window, in_window, min_nodes, out_cooldown_s, in_cooldown_s)| ElasticConfig {
                out_window,
                in_window,
                min_nodes,
                out_cooldown_s,
                in_cooldown_s,
                // Thresholds that the random figures cross often.
                out_cpu_pct: 40.0,
                out_gpu_pct: 50.0,
                in_cpu_pct: 50.0,
                in_gpu_pct: 60.0,
                ..ElasticConfig::default()
            },
        )
    }

    fn run(config: ElasticConfig, steps: &[(i64, Figures)]) -> Vec<Option<Action>> {
        let mut e = Elastic::new(config);
        let mut now = 0;
        steps
            .iter()
            .map(|(dt, f)| {
                now += dt;
                e.evaluate(now, f.clone())
            })
            .collect()
    }

    proptest! {
        #[test]
        fn rules_hold_over_any_sequence(
            config in arb_config(),
            steps in proptest::collection::vec((0i64..120, arb_figures()), 1..60),
        ) {
            let actions = run(config, &steps);
            let mut now = 0;
            let mut last: Option<(ActionKind, i64)> = None;
            for (i, ((dt, f), a)) in steps.iter().zip(&actions).enumerate() {
                now += dt;
                let Some(a) = a else { continue };
                // Never during the last action's cooldown.
                if let Some((kind, at)) = last {
                    let cooldown = match kind {
                        ActionKind::ScaleOut => config.out_cooldown_s,
                        ActionKind::ScaleIn => config.in_cooldown_s,
                    } as i64;
                    prop_assert!(now >= at + cooldown, "action at {now} in the cooldown of {at}");
                }
                prop_assert_eq!(&a.figures, f);
                prop_assert_eq!(a.at_s, now);
                match a.rule {
                    Rule::Busy => {
                        let w = config.out_window as usize;
                        prop_assert!(i + 1 >= w);
                        for (_, g) in &steps[i + 1 - w..=i] {
                            prop_assert!(busy(&config, g), "{g:?} in the window is not busy");
                        }
                    }
                    Rule::QueueWait => {
                        prop_assert!(f.oldest_queued_s.unwrap_or(0) > config.queue_wait_s);
                    }
                    Rule::Idle => {
                        // Never at or below min_nodes, nor with work waiting.
                        prop_assert!(f.live_nodes > config.min_nodes);
                        prop_assert_eq!(f.queued, 0);
                        let w = config.in_window as usize;
                        prop_assert!(i + 1 >= w);
                        for (_, g) in &steps[i + 1 - w..=i] {
                            prop_assert!(idle(&config, g));
                        }
                    }
                }
                prop_assert_eq!(
                    a.kind,
                    if a.rule == Rule::Idle { ActionKind::ScaleIn } else { ActionKind::ScaleOut }
                );
                last = Some((a.kind, now));
            }
            // Deterministic: the same sequence, the same answers.
            prop_assert_eq!(run(config, &steps), actions);
        }

        /// The scale-out rule fires as soon as it has held over its window out of cooldown.
        #[test]
        fn busy_fires_once_held(config in arb_config(), n in 1usize..10) {
            let busy_figures = figures(2, 99.0, Some(99.0));
            let steps: Vec<(i64, Figures)> = (0..n).map(|_| (1, busy_figures.clone())).collect();
            let actions = run(config, &steps);
            let first = actions.iter().position(Option::is_some);
            prop_assert_eq!(first, (n >= config.out_window as usize).then(|| config.out_window as usize - 1));
        }
    }
}
