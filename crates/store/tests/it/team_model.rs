//! Model-based property test of team balances and monthly budgets against the ledger, exact
//! to the micro-unit. Three users (granted credit) and two teams (members added with
//! `set_member`) go through random schedules: moves of a member's own credit into a team
//! (refused beyond their balance with nothing changed; retried under its transfer id: moved
//! once, or refused for another amount), on-demand reservations paid by a user or a team (made
//! by a member) reported running and gone, stopped, settled (stopped there when the payer
//! cannot pay its next period), time crossing the end of a month, monthly budgets set, and the
//! server's budget pass (after each settlement and at once for a new budget: thresholds fired
//! once each, the refusal marked or cleared, running work stopped at the limit when asked).
//!
//! After every operation each payer's balance and hold are an independent model's (grants −
//! moves out + moves in − holds + holds given back − charges, each the `Rate` over the whole
//! seconds run, charged when settled or ended), so are its budget's facts (the month's spend:
//! the charges since the month began; burn, refusal mark, alerts fired), and a reservation is
//! refused `BudgetExceeded` exactly when the model's pass marked its payer for this month. At
//! the end nothing is held, every reservation is charged the model's amount, the node's owner
//! earned its share and the ledger balances. On SQLite and PostgreSQL.

use std::collections::BTreeMap;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, TimeZone, Utc};
use gpurent_billing::budget::{month_of, Budget};
use gpurent_billing::{PriceList, Rate, Size};
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation, Scope, SqlStore, StoreError};
use gpurent_types::agent::InstanceState;
use gpurent_types::{GpuType, Money, TeamRole, Tier};
use proptest::prelude::*;

use crate::support::{self, one_gpu, Fixture};

/// The store's answer, which must be `Ok`.
macro_rules! ok {
    ($call:expr) => {
        $call.await.unwrap()
    };
}

const USERS: usize = 3;
const TEAMS: usize = 2;
/// Users first, then teams: who pays is an index into these.
const PAYERS: usize = USERS + TEAMS;
/// Each team's owner, then its other member.
const MEMBERS: [[usize; 2]; TEAMS] = [[0, 1], [2, 0]];
const GPUS: usize = 6;
/// The hours of every reservation: some run past them.
const DURATION_S: i64 = 2 * 3600;
/// The settlement period, as the server's default.
const PERIOD_S: i64 = 60;
/// The alert the pass fires for a low balance (`server::budgets::pass::LOW_BALANCE`).
const LOW_BALANCE: &str = "low_balance";

/// What a member moves: so many micro-units, their whole balance, or one micro-unit more.
#[derive(Debug, Clone, Copy)]
enum Amount {
    Micros(i64),
    All,
    OneMore,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Grant(usize, i64),
    /// Team, which of its members, how much.
    Move(usize, usize, Amount),
    /// The last move again under its transfer id: the same amount, or (true) another.
    Retry(bool),
    /// Payer (past the last: the one whose budget was set last), which member of a team makes
    /// it, and whether its agent reports it running at once.
    Reserve(usize, usize, bool),
    Running(usize),
    Stop(usize),
    Gone(usize),
    Advance(i64),
    /// A settlement, then the budget pass.
    Settle,
    /// Payer, monthly micro-units, stop at the limit, low-balance alert; then the pass.
    SetBudget(usize, i64, bool, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let amount = prop_oneof![
        4 => (1i64..6_000_000).prop_map(Amount::Micros),
        1 => Just(Amount::All),
        1 => Just(Amount::OneMore),
    ];
    prop_oneof![
        1 => ((0..USERS), (100_000i64..30_000_000)).prop_map(|(u, a)| Op::Grant(u, a)),
        3 => ((0..TEAMS), (0usize..2), amount).prop_map(|(t, m, a)| Op::Move(t, m, a)),
        1 => any::<bool>().prop_map(Op::Retry),
        5 => ((0..PAYERS + 3), (0usize..2), (0u8..3))
            .prop_map(|(p, m, r)| Op::Reserve(p, m, r > 0)),
        5 => (0usize..8).prop_map(Op::Running),
        1 => (0usize..8).prop_map(Op::Stop),
        2 => (0usize..8).prop_map(Op::Gone),
        6 => prop_oneof![4 => 1i64..1500, 1 => 1500i64..12_000].prop_map(Op::Advance),
        3 => Just(Op::Settle),
        3 => ((0..PAYERS), (10_000i64..2_000_000), any::<bool>(), any::<bool>())
            .prop_map(|(p, m, s, l)| Op::SetBudget(p, m, s, l)),
    ]
}

/// One reservation, in whole seconds since the schedule began.
#[derive(Debug, Clone, Default)]
struct Res {
    id: String,
    payer: usize,
    start: Option<i64>,
    /// Settled up to (its meter open): while it runs and no stop was asked.
    settled: Option<i64>,
    stop_at: Option<i64>,
    ended: bool,
    charged: i64,
    held: i64,
}

impl Res {
    /// Running, as the store sees it: started, no stop asked, not ended.
    fn running(&self) -> bool {
        self.start.is_some() && self.stop_at.is_none() && !self.ended
    }
}

#[derive(Debug, Clone, Default)]
struct Payer {
    balance: i64,
    held: i64,
    budget: Option<Budget>,
    /// The month its new reservations are refused in (`users.over_budget`).
    mark: Option<String>,
    /// The alerts fired: (month, alert) → (spent then, when).
    fired: BTreeMap<(String, String), (i64, i64)>,
}

/// A move's balances after (user, team), or the balance it exceeds (`None`: its id was used
/// with another amount).
type Moved = Result<(i64, i64), Option<i64>>;

#[derive(Debug)]
struct World {
    base: DateTime<Utc>,
    now: i64,
    rate: Rate,
    price: i64,
    hold: i64,
    payers: Vec<Payer>,
    res: Vec<Res>,
    /// Every charge recorded: when, to whom, how much.
    charges: Vec<(i64, usize, i64)>,
    /// The moves recorded, by transfer id.
    moved: BTreeMap<String, i64>,
}

impl World {
    fn at(&self, s: i64) -> DateTime<Utc> {
        self.base + Duration::seconds(s)
    }

    fn month(&self) -> String {
        month_of(self.at(self.now)).2
    }

    /// Reservation `i` billed to `end`: the rate over the whole seconds from its start (never
    /// less than charged before), the rest charged now and what it holds given back.
    fn bill(&mut self, i: usize, end: i64) {
        let r = &self.res[i];
        let ran = r.start.map_or(0, |s| u64::try_from(end - s).unwrap());
        let owed = self.rate.charge_for_seconds(ran).micros().max(r.charged);
        let (p, due, held) = (r.payer, owed - r.charged, r.held);
        (self.res[i].charged, self.res[i].held) = (owed, 0);
        self.charges.push((self.now, p, due));
        self.payers[p].balance += held - due;
        self.payers[p].held -= held;
    }

    /// The charges to `p` recorded since its month (of now) began.
    fn spent(&self, p: usize) -> i64 {
        let first = month_of(self.at(self.now)).0;
        let mine = self
            .charges
            .iter()
            .filter(|(t, q, _)| *q == p && self.at(*t) >= first);
        mine.map(|(_, _, a)| a).sum()
    }

    fn burn(&self, p: usize) -> i64 {
        let running = self.res.iter().filter(|r| r.payer == p && r.running());
        self.price * i64::try_from(running.count()).unwrap()
    }

    /// A stop asked now: billing ends now, or at the end of its hours if those are up.
    fn stop(&mut self, i: usize) {
        let now = self.now;
        let r = &mut self.res[i];
        if r.ended || r.stop_at.is_some() {
            return;
        }
        r.stop_at = Some(match r.start {
            Some(s) if now >= s + DURATION_S => s + DURATION_S,
            _ => now,
        });
        r.settled = None;
    }

    /// Its agent says it is gone: the rest is charged now, what it holds given back.
    fn gone(&mut self, i: usize) {
        let r = &self.res[i];
        if r.ended {
            return;
        }
        let mut end = r.stop_at.map_or(self.now, |t| t.min(self.now));
        if let Some(s) = r.start {
            end = end.min(s + DURATION_S);
        }
        self.bill(i, end);
        (self.res[i].ended, self.res[i].settled) = (true, None);
    }

    /// `settle_due`: what ran since the last settlement a period ago or more is charged, the
    /// first hour held given back, and a payer who cannot pay its next period stopped.
    fn settle(&mut self) {
        let cutoff = self.now - PERIOD_S;
        let mut need = [0i64; PAYERS];
        let mut settled = Vec::new();
        for i in 0..self.res.len() {
            let r = &self.res[i];
            let (Some(until), Some(s)) = (r.settled, r.start) else {
                continue;
            };
            if until > cutoff {
                continue;
            }
            let end = self.now.min(s + DURATION_S);
            need[r.payer] += self.price * PERIOD_S / 3600;
            self.bill(i, end);
            self.res[i].settled = Some(end);
            settled.push((i, end));
        }
        for (i, end) in settled {
            if self.payers[self.res[i].payer].balance < need[self.res[i].payer] {
                (self.res[i].stop_at, self.res[i].settled) = (Some(end), None);
            }
        }
    }

    /// A move of `user`'s own credit into `team` under transfer id `id`.
    fn move_credit(&mut self, id: &str, user: usize, team: usize, a: i64) -> Moved {
        match self.moved.get(id) {
            Some(&was) if was != a => return Err(None),
            Some(_) => {}
            None if self.payers[user].balance < a => return Err(Some(self.payers[user].balance)),
            None => {
                (self.payers[user].balance, self.payers[team].balance) =
                    (self.payers[user].balance - a, self.payers[team].balance + a);
                self.moved.insert(id.to_owned(), a);
            }
        }
        Ok((self.payers[user].balance, self.payers[team].balance))
    }
}

/// Every payer's balance and hold, and its budget's facts, against the model.
async fn check(store: &SqlStore, ids: &[String], w: &World) {
    let month = w.month();
    for (p, id) in ids.iter().enumerate() {
        let (balance, held, _) = ok!(store.accounts(id));
        let (model, at) = (&w.payers[p], w.now);
        let want = (model.balance, model.held);
        assert_eq!((balance.micros(), held.micros()), want, "payer {p} at {at}");
        let Some(budget) = &model.budget else {
            continue;
        };
        let facts = ok!(store.budget_facts(id, w.at(w.now))).unwrap();
        assert_eq!((&facts.budget, facts.balance), (budget, balance));
        let spent = (facts.spent.micros(), facts.burn_per_hour.micros());
        assert_eq!(spent, (w.spent(p), w.burn(p)), "payer {p} at {at}");
        assert_eq!(facts.over, model.mark.as_ref() == Some(&month));
        for (alert, spent, at) in &facts.fired {
            let then = (spent.micros(), (*at - w.base).num_seconds());
            assert_eq!(
                model.fired.get(&(month.clone(), alert.clone())),
                Some(&then)
            );
        }
        let in_month = model.fired.keys().filter(|(m, _)| *m == month).count();
        assert_eq!(facts.fired.len(), in_month, "payer {p}'s alerts");
    }
}

/// The server's budget pass (`server::budgets::pass::assess`) for every payer with a budget,
/// the model's alongside.
async fn pass(store: &SqlStore, ids: &[String], w: &mut World) {
    let (now, month) = (w.at(w.now), w.month());
    let budgeted: Vec<_> = (0..PAYERS)
        .filter(|p| w.payers[*p].budget.is_some())
        .collect();
    let mut tenants: Vec<_> = budgeted.iter().map(|p| ids[*p].clone()).collect();
    tenants.sort();
    assert_eq!(ok!(store.budget_tenants()), tenants);
    for p in budgeted {
        let (id, budget) = (&ids[p], w.payers[p].budget.clone().unwrap());
        let facts = ok!(store.budget_facts(id, now)).unwrap();
        assert_eq!(facts.spent.micros(), w.spent(p), "payer {p} at {}", w.now);
        let reached = budget.reached(facts.spent);
        let mut alerts: Vec<_> = reached.iter().map(u32::to_string).collect();
        if budget.is_low(facts.balance, facts.burn_per_hour) {
            alerts.push(LOW_BALANCE.to_owned());
        }
        for alert in alerts {
            let fired = ok!(store.fire_budget_alert(id, &month, &alert, facts.spent, now));
            let key = (month.clone(), alert);
            assert_eq!(
                fired,
                !w.payers[p].fired.contains_key(&key),
                "payer {p}: once"
            );
            let then = (facts.spent.micros(), w.now);
            w.payers[p].fired.entry(key).or_insert(then);
        }
        let over = budget.is_over(facts.spent);
        if over != facts.over {
            let mark = over.then_some(month.as_str());
            ok!(store.set_over_budget(id, mark));
            w.payers[p].mark = mark.map(str::to_owned);
        }
        assert_eq!(w.payers[p].mark.as_ref() == Some(&month), over);
        if over && budget.stop_at_limit {
            ok!(store.stop_for_budget(id, now));
            for i in 0..w.res.len() {
                if w.res[i].payer == p && w.res[i].running() {
                    w.stop(i);
                }
            }
        }
    }
}

/// The node's agent reports the instance of reservation `id` in `state` at `at`.
async fn agent(store: &SqlStore, node: &str, id: &str, state: InstanceState, at: DateTime<Utc>) {
    let report = support::report(id, 1, state, None);
    ok!(store.sync_node(node, &report, at));
}

async fn run(backend: Backend, before_month_end: i64, december: bool, ops: Vec<Op>) {
    let f = Fixture::new(backend).await;
    let store = f.store.clone();
    let gpus = u32::try_from(GPUS).unwrap();
    let (node, owner) = f.node_owned("n", "NVIDIA GeForce RTX 4090", gpus).await;
    let prices = PriceList::defaults();
    let (rtx4090, hours) = (GpuType::parse("rtx4090").unwrap(), DURATION_S as u64);
    let one = Size::Whole {
        count: 1,
        gpu_vram_mb: 24_576,
    };
    let quote = prices.quote(&rtx4090, one, hours, Tier::OnDemand, None);
    let quote = quote.unwrap();
    let month_end = match december {
        true => Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0),
        false => Utc.with_ymd_and_hms(2026, 2, 1, 0, 0, 0),
    };
    let mut w = World {
        base: month_end.single().unwrap() - Duration::seconds(before_month_end),
        now: 0,
        rate: quote.rate,
        price: quote.price_per_hour.micros(),
        hold: quote.hold.micros(),
        payers: vec![Payer::default(); PAYERS],
        res: Vec::new(),
        charges: Vec::new(),
        moved: BTreeMap::new(),
    };
    let mut ids = Vec::new();
    for u in 0..USERS {
        ids.push(f.user(&format!("u{u}"), "0").await);
    }
    for (t, [owner_of, member]) in MEMBERS.iter().enumerate() {
        let team = ok!(store.create_team(&format!("team{t}"), &ids[*owner_of], w.at(0)));
        let role = TeamRole::Member;
        ok!(store.set_member(&team.id, &ids[*member], role, false, w.at(0)));
        assert_eq!(ok!(store.team_role(&team.id, &ids[*member])), Some(role));
        ids.push(team.id);
    }
    let (mut grants, mut moves, mut last_budget) = (0, 0, None);
    let mut last_move: Option<(String, usize, usize, i64)> = None;
    // Every user is granted 8 first.
    for op in (0..USERS).map(|u| Op::Grant(u, 8_000_000)).chain(ops) {
        let now = w.at(w.now);
        let pick = |i: usize, w: &World| (!w.res.is_empty()).then(|| i % w.res.len());
        match op {
            Op::Grant(u, amount) => {
                grants += 1;
                let id = format!("g{grants}");
                let after = store.grant_credit(&ids[u], Money::from_micros(amount), &id, now);
                w.payers[u].balance += amount;
                assert_eq!(after.await.unwrap().micros(), w.payers[u].balance);
            }
            Op::Move(..) | Op::Retry(_) => {
                let (id, user, team, amount) = match (op, &last_move) {
                    (Op::Move(t, m, amount), _) => {
                        let (user, balance) = (MEMBERS[t][m], w.payers[MEMBERS[t][m]].balance);
                        let amount = match amount {
                            Amount::Micros(a) => a,
                            Amount::All => balance,
                            Amount::OneMore => balance + 1,
                        };
                        if amount <= 0 {
                            continue;
                        }
                        moves += 1;
                        (format!("m{moves}"), user, USERS + t, amount)
                    }
                    (Op::Retry(other), Some((id, u, t, a))) => {
                        (id.clone(), *u, *t, a + i64::from(other))
                    }
                    _ => continue,
                };
                let expected = w.move_credit(&id, user, team, amount);
                let (from, to, money) = (&ids[user], &ids[team], Money::from_micros(amount));
                let got = store.move_credit(from, to, money, &id, now).await;
                match (got, expected) {
                    (Ok((u, t)), Ok(model)) => assert_eq!((u.micros(), t.micros()), model),
                    (Err(StoreError::InsufficientCredit { needed, balance }), Err(Some(b))) => {
                        assert_eq!((needed.micros(), balance.micros()), (amount, b));
                    }
                    (Err(StoreError::IdempotencyMismatch), Err(None)) => {}
                    (got, model) => panic!("move {id} of {amount}: {got:?}, model {model:?}"),
                }
                if matches!(op, Op::Move(..)) {
                    last_move = Some((id, user, team, amount));
                }
            }
            Op::Reserve(p, m, run) => {
                let p = last_budget.filter(|_| p >= PAYERS).unwrap_or(p % PAYERS);
                let maker = (p >= USERS).then(|| ids[MEMBERS[p - USERS][m]].clone());
                let new = NewReservation {
                    duration_s: hours,
                    created_by: maker.clone(),
                    ..one_gpu(&ids[p])
                };
                // The node must look alive at this time.
                agent(&store, &node, "none", InstanceState::Running, now).await;
                let live_since = now - Duration::seconds(10);
                let got = store.reserve(new, &prices, live_since, now, &[]).await;
                let model = &w.payers[p];
                let marked = model.mark.as_ref() == Some(&w.month());
                // A mark is for a month whose spend reached the budget; spend only grows in it.
                let spent = Money::from_micros(w.spent(p));
                assert!(!marked || model.budget.as_ref().is_some_and(|b| b.is_over(spent)));
                let expected = match () {
                    _ if w.res.iter().filter(|r| !r.ended).count() >= GPUS => "no capacity",
                    _ if marked => "budget",
                    _ if model.balance < w.hold => "credit",
                    _ => "reserved",
                };
                let outcome = match &got {
                    Err(StoreError::NoCapacity(_)) => "no capacity",
                    Err(StoreError::BudgetExceeded(_)) => "budget",
                    Err(StoreError::InsufficientCredit { needed, balance }) => {
                        assert_eq!((needed.micros(), balance.micros()), (w.hold, model.balance));
                        "credit"
                    }
                    Ok(_) => "reserved",
                    Err(e) => panic!("reserve for payer {p}: {e}"),
                };
                assert_eq!(outcome, expected, "reserve for payer {p} at {}", w.now);
                let Ok((r, _)) = got else { continue };
                assert_eq!((&r.tenant_id, &r.created_by), (&ids[p], &maker));
                assert_eq!(r.price_per_hour.micros(), w.price);
                (w.payers[p].balance, w.payers[p].held) =
                    (w.payers[p].balance - w.hold, w.payers[p].held + w.hold);
                let mut res = Res::default();
                (res.id, res.payer, res.held) = (r.id, p, w.hold);
                w.res.push(res);
                if run {
                    agent(
                        &store,
                        &node,
                        &w.res[w.res.len() - 1].id,
                        InstanceState::Running,
                        now,
                    )
                    .await;
                    let r = w.res.last_mut().unwrap();
                    (r.start, r.settled) = (Some(w.now), Some(w.now));
                }
            }
            Op::Running(i) => {
                let Some(i) = pick(i, &w) else { continue };
                agent(&store, &node, &w.res[i].id, InstanceState::Running, now).await;
                let r = &mut w.res[i];
                if r.start.is_none() && r.stop_at.is_none() && !r.ended {
                    (r.start, r.settled) = (Some(w.now), Some(w.now));
                }
            }
            Op::Stop(i) => {
                let Some(i) = pick(i, &w) else { continue };
                ok!(store.request_stop(&w.res[i].id, &Scope::All, now));
                w.stop(i);
            }
            Op::Gone(i) => {
                let Some(i) = pick(i, &w) else { continue };
                agent(&store, &node, &w.res[i].id, InstanceState::Stopped, now).await;
                w.gone(i);
            }
            Op::Advance(s) => w.now += s,
            Op::Settle => {
                ok!(store.settle_due(now, StdDuration::from_secs(60)));
                w.settle();
                pass(&store, &ids, &mut w).await;
            }
            Op::SetBudget(p, monthly, stop, low) => {
                let monthly = Money::from_micros(monthly);
                let budget = Budget::new(monthly, &[50, 80, 100], stop, if low { 24 } else { 0 });
                ok!(store.set_budget(&ids[p], budget.as_ref().unwrap(), now));
                (w.payers[p].budget, last_budget) = (budget.ok(), Some(p));
                pass(&store, &ids, &mut w).await;
            }
        }
        check(&store, &ids, &w).await;
    }

    // Wind everything down: stop what is left and let the agent confirm, twice.
    w.now += 1;
    for i in 0..w.res.len() {
        let id = w.res[i].id.clone();
        ok!(store.request_stop(&id, &Scope::All, w.at(w.now)));
        w.stop(i);
        for _ in 0..2 {
            agent(&store, &node, &id, InstanceState::Stopped, w.at(w.now + 5)).await;
        }
    }
    w.now += 5;
    for i in 0..w.res.len() {
        w.gone(i);
    }
    ok!(store.settle_due(w.at(w.now + 120), StdDuration::from_secs(60)));
    check(&store, &ids, &w).await;
    let mut share = 0;
    for r in &w.res {
        let got = ok!(store.get_reservation(&r.id, &Scope::All));
        assert!(got.status.is_terminal(), "{} is {}", r.id, got.status);
        assert_eq!(got.charged.micros(), r.charged, "{r:?}: {got:?}");
        share += r.charged * i64::from(prices.host_share_bps) / 10_000;
    }
    assert!(
        w.payers.iter().all(|p| p.held == 0),
        "nothing is held at the end"
    );
    // User 0 owns the first team and is a member of the second.
    for team in ok!(store.list_teams(Some(&ids[0]))) {
        let t = ids.iter().position(|id| *id == team.id).unwrap();
        assert_eq!(team.balance.micros(), w.payers[t].balance);
        let role = [TeamRole::Owner, TeamRole::Member][t - USERS];
        assert_eq!(team.role, Some(role));
    }
    let (_, _, earned) = ok!(store.accounts(&owner));
    assert_eq!(earned.micros(), share);
    let ledger = ok!(store.ledger_check());
    assert!(ledger.ok(), "{ledger:?}");
    store.close().await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn balances_and_budgets_match_the_model_on_sqlite(
        before in 1i64..15_000,
        december in any::<bool>(),
        ops in proptest::collection::vec(op(), 20..48),
    ) {
        runtime().block_on(run(Backend::Sqlite, before, december, ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn balances_and_budgets_match_the_model_on_postgres(
        before in 1i64..15_000,
        december in any::<bool>(),
        ops in proptest::collection::vec(op(), 20..48),
    ) {
        runtime().block_on(run(Backend::Postgres, before, december, ops));
    }
}
