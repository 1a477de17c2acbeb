//! Turning request bodies into store intents, with a 422 naming the field for every bad value.

use gpurent_store::{NewReservation, Want};
use gpurent_types::agent::GpuInfo;
use gpurent_types::api::{CreateReservation, CreateUser};
use gpurent_types::{GpuType, Money, OnNodeLoss, RestartPolicy, Role, Tier};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The most whole GPUs one reservation may ask for (one node).
pub const MAX_GPU_COUNT: u32 = 64;
pub const MAX_VRAM_GB: u32 = 1024;
const MIB_PER_GB: u64 = 1024;
/// A year.
pub const MAX_HOURS: f64 = 8760.0;
/// 3.6 seconds: the schema's minimum.
pub const MIN_HOURS: f64 = 0.001;
const MAX_ARGS: usize = 256;
const MAX_ENV: usize = 128;
const MAX_TEXT: usize = 8192;
const MAX_PORTS: usize = 16;
/// Ports one reservation publishes through the HTTP proxy.
const MAX_HTTP_PORTS: usize = 8;

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::Invalid(msg.into())
}

/// What the executors set for every instance: which GPUs it sees, what the NVIDIA runtime
/// gives it, and gpurent's own facts. A tenant's value would give it another tenant's GPUs.
const RESERVED_VARIABLES: &str = "CUDA_VISIBLE_DEVICES, NVIDIA_*, GPURENT_*";

/// Case-insensitively: a tool that upper-cases names must not find a way around it.
pub fn is_reserved_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper == "CUDA_VISIBLE_DEVICES" || upper.starts_with("NVIDIA_") || upper.starts_with("GPURENT_")
}

/// Characters that rewrite a terminal or reorder what a person reads: C0 and C1 controls
/// (ESC, CR, TAB, NUL ...), DEL, and the bidirectional overrides and isolates.
fn is_unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A name or label shown in lists (`tokens ls`, `nodes ls`): no control characters.
pub fn printable(field: &str, value: &str) -> Result<(), ApiError> {
    if value.chars().any(is_unprintable) {
        return Err(invalid(format!(
            "{field}: control characters (escape sequences, carriage returns, tabs, NUL) are not allowed"
        )));
    }
    Ok(())
}

/// NUL bytes end C strings: an argument, variable or image name with one would be cut short
/// (or refused) only at the agent, after the tenant was charged. Secrets' values are never
/// repeated, so the message names only where.
fn no_nul_in_request(body: &CreateReservation) -> Result<(), ApiError> {
    let nul = |t: &str| t.contains('\0');
    if nul(&body.gpu_type) {
        return Err(invalid("gpu_type: contains a NUL byte"));
    }
    if body.image.as_deref().is_some_and(nul) {
        return Err(invalid("image: contains a NUL byte"));
    }
    if let Some(i) = body.command.iter().position(|a| nul(a)) {
        return Err(invalid(format!("command[{i}]: contains a NUL byte")));
    }
    for (what, vars) in [("env", &body.env), ("secrets", &body.secrets)] {
        if vars.iter().any(|(k, v)| nul(k) || nul(v)) {
            return Err(invalid(format!(
                "{what}: a variable's name or value contains a NUL byte"
            )));
        }
    }
    Ok(())
}

/// Whether the body asks for a share of a GPU, sized against the type's card (the handler then
/// reads the card's memory for [`reservation`]).
pub fn asks_share(body: &CreateReservation) -> bool {
    body.vram_gb.is_some() || body.vram_fraction.is_some()
}

/// A share's size in MiB, against a card of `card_mb` (the type's largest; `None`: no node
/// has one). `vram_gb` up to the card's memory to the nearest GB is capped at the card, so that
/// 24 on a 24,564 MiB RTX 4090 is all of it; a fraction is rounded down to the MiB, so that it
/// fits. All of a card is still a share: nobody else can have a share of it meanwhile.
fn share_mb(body: &CreateReservation, card_mb: Option<u64>) -> Result<Option<u64>, ApiError> {
    let gpu_type = &body.gpu_type;
    match (body.vram_gb, body.vram_fraction) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(invalid(
            "give vram_gb (GB of one GPU) or vram_fraction (a fraction of one), not both",
        )),
        (Some(0), None) => Err(invalid("vram_gb must be at least 1")),
        (Some(gb), None) if gb > MAX_VRAM_GB => {
            Err(invalid(format!("vram_gb must be at most {MAX_VRAM_GB}")))
        }
        (Some(gb), None) => {
            let asked = u64::from(gb) * MIB_PER_GB;
            Ok(Some(match card_mb {
                Some(card) if u64::from(gb) <= (card + MIB_PER_GB / 2) / MIB_PER_GB => {
                    asked.min(card)
                }
                // Larger than any card: the store says so (409 no_capacity), or queues it.
                _ => asked,
            }))
        }
        (None, Some(f)) => {
            if !f.is_finite() || f <= 0.0 || f > 1.0 {
                return Err(invalid(
                    "vram_fraction must be more than 0 and at most 1 (0.5: half of one GPU)",
                ));
            }
            let Some(card) = card_mb else {
                return Err(ApiError::Store(gpurent_store::StoreError::NoCapacity(
                    format!("no node has a GPU of type {gpu_type} to take vram_fraction {f} of"),
                )));
            };
            // In millionths, so that the MiB are integer arithmetic.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 1..=1e6
            let ppm = (f * 1e6).round().max(1.0) as u64;
            Ok(Some((card * ppm / 1_000_000).max(1)))
        }
    }
}

/// `card_vram_mb`: the memory of the type's largest card, for a share (see [`asks_share`]).
pub fn reservation(
    tenant_id: &str,
    body: &CreateReservation,
    idempotency_key: Option<String>,
    card_vram_mb: Option<u64>,
) -> Result<NewReservation, ApiError> {
    no_nul_in_request(body)?;
    let gpu_type = GpuType::parse(&body.gpu_type).map_err(|e| invalid(format!("gpu_type: {e}")))?;
    if body.gpu_count.is_some() && asks_share(body) {
        return Err(invalid(
            "give gpu_count (whole GPUs), or vram_gb or vram_fraction (a share of one), not both",
        ));
    }
    let want = match (share_mb(body, card_vram_mb)?, body.gpu_count) {
        (Some(vram_mb), _) => Want::Share { vram_mb },
        (None, Some(0)) => return Err(invalid("gpu_count must be at least 1")),
        (None, Some(n)) if n > MAX_GPU_COUNT => {
            return Err(invalid(format!(
                "gpu_count must be at most {MAX_GPU_COUNT} (one node)"
            )))
        }
        (None, Some(count)) => Want::Whole { count },
        (None, None) => Want::Whole { count: 1 },
    };
    if !body.hours.is_finite() || body.hours < MIN_HOURS || body.hours > MAX_HOURS {
        return Err(invalid(format!(
            "hours must be at least {MIN_HOURS} and at most {MAX_HOURS}"
        )));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // bounded just above
    let duration_s = (body.hours * 3600.0).round() as u64;
    let tier = body.tier.unwrap_or_default();
    if body.bid.is_some() && tier != Tier::Spot {
        return Err(invalid("bid is only for the spot tier"));
    }
    if body.bid.is_some_and(|b| b <= Money::ZERO) {
        return Err(invalid("bid must be more than 0"));
    }
    if let Some(image) = &body.image {
        if image.is_empty() || image.len() > 255 || image.chars().any(char::is_whitespace) {
            return Err(invalid("image must be 1-255 characters without spaces"));
        }
    }
    if body.command.len() > MAX_ARGS || body.command.iter().any(|a| a.len() > MAX_TEXT) {
        return Err(invalid(format!(
            "command may have at most {MAX_ARGS} arguments of {MAX_TEXT} bytes"
        )));
    }
    // The first word is the program: an empty one runs nothing, yet would be charged. Later
    // words may be empty (`sh -c ''` and `--flag ''` are arguments).
    if body.command.first().is_some_and(|p| p.trim().is_empty()) {
        return Err(invalid(
            "command[0]: empty; the first word is the program to run",
        ));
    }
    if body.env.len() > MAX_ENV {
        return Err(invalid(format!("env may have at most {MAX_ENV} variables")));
    }
    for (what, vars) in [("env", &body.env), ("secrets", &body.secrets)] {
        for (k, v) in vars {
            let valid_name = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && k.len() <= 255;
            if !valid_name {
                return Err(invalid(format!(
                    "{what}: {k:?} is not a valid variable name"
                )));
            }
            if is_reserved_variable(k) {
                return Err(invalid(format!(
                    "{what}: {k} is set by gpurent for every instance ({RESERVED_VARIABLES}) and cannot be given"
                )));
            }
            // A secret's value is never repeated, not even in an error.
            if v.len() > MAX_TEXT {
                return Err(invalid(format!(
                    "{what}: the value of {k} is longer than {MAX_TEXT} bytes"
                )));
            }
        }
    }
    if body.secrets.len() > MAX_ENV {
        return Err(invalid(format!("secrets: at most {MAX_ENV} variables")));
    }
    if let Some(name) = body.secrets.keys().find(|k| body.env.contains_key(*k)) {
        return Err(invalid(format!(
            "secrets: {name} is also in env; give each variable once"
        )));
    }
    let mut ports = body.ports.clone();
    ports.sort_unstable();
    ports.dedup();
    if ports.len() != body.ports.len() || ports.len() > MAX_PORTS || ports.contains(&0) {
        return Err(invalid(format!(
            "ports must be at most {MAX_PORTS} distinct numbers from 1 to 65535"
        )));
    }
    http_ports(&body.http_ports)?;
    let (restart, max_restarts) = restart_policy(body)?;
    Ok(NewReservation {
        tenant_id: tenant_id.to_owned(),
        created_by: None,
        gpu_type,
        want,
        duration_s,
        tier,
        bid: body.bid,
        image: body.image.clone(),
        command: body.command.clone(),
        env: body.env.clone(),
        ports: body.ports.clone(),
        http_ports: body.http_ports.clone(),
        idempotency_key,
        // Without the secrets' values: the hash is kept, and must not let anyone test a guess.
        request_hash: request_hash(&CreateReservation {
            secrets: body
                .secrets
                .keys()
                .map(|k| (k.clone(), String::new()))
                .collect(),
            ..body.clone()
        }),
        queue: body.queue,
        on_node_loss: body.on_node_loss.unwrap_or_default(),
        idle_reclaim: body.idle_reclaim.unwrap_or(true),
        checkpoint: body.checkpoint,
        // Sealed by the handler, with the master key.
        sealed_secrets: None,
        secret_names: body.secrets.keys().cloned().collect(),
        // The handler sets the platform's caps.
        limits: gpurent_store::TenantLimits::default(),
        // The handler resolves the volumes (`volumes::mounts`).
        mounts: Vec::new(),
        node_filter: Default::default(),
        replica_of: None,
        array_of: None,
        avoid_nodes: Vec::new(),
        restart,
        max_restarts,
    })
}

/// Where a managed job's checkpoint volume is mounted (the agent names it in
/// `GPURENT_CHECKPOINT_DIR`).
pub const CHECKPOINT_VOLUME_PATH: &str = "/checkpoint";

/// A managed job's restart policy and bound: `max_restarts` only with a policy that restarts
/// failures; a policy that restarts interruptions not with `on_node_loss: stop`; a checkpoint
/// volume not with the node's checkpoint directory (both are `GPURENT_CHECKPOINT_DIR`).
fn restart_policy(body: &CreateReservation) -> Result<(RestartPolicy, u32), ApiError> {
    use gpurent_sched::restart::{DEFAULT_MAX_RESTARTS, MAX_RESTARTS};
    let policy = body.restart.unwrap_or_default();
    let max = match (policy, body.max_restarts) {
        (RestartPolicy::Never | RestartPolicy::OnInterruption, Some(_)) => {
            return Err(invalid(format!(
                "max_restarts: bounds the restarts of failed runs, which restart {} does not make; give restart on-failure or always",
                policy.as_str()
            )))
        }
        (_, Some(n)) if n > MAX_RESTARTS => {
            return Err(invalid(format!(
                "max_restarts: at most {MAX_RESTARTS} (got {n})"
            )))
        }
        (_, Some(n)) => n,
        (RestartPolicy::Never | RestartPolicy::OnInterruption, None) => 0,
        (_, None) => DEFAULT_MAX_RESTARTS,
    };
    if policy != RestartPolicy::Never && body.on_node_loss == Some(OnNodeLoss::Stop) {
        return Err(invalid(format!(
            "on_node_loss: stop ends the job when its node is lost, but restart {} runs it again; give one or the other",
            policy.as_str()
        )));
    }
    if let Some(name) = &body.checkpoint_volume {
        resource_name(name).map_err(|_| {
            invalid(format!(
                "checkpoint_volume: {name:?} is not a volume's name (1 to 64 letters, digits and - _ .)"
            ))
        })?;
        if body.checkpoint {
            return Err(invalid(
                "checkpoint_volume: give it or checkpoint (the node's checkpoint directory), not both",
            ));
        }
        if let Some(m) = body
            .volumes
            .iter()
            .find(|m| m.path.trim_end_matches('/') == CHECKPOINT_VOLUME_PATH)
        {
            return Err(invalid(format!(
                "volumes: {} is mounted at {CHECKPOINT_VOLUME_PATH}, where the checkpoint volume goes",
                m.volume
            )));
        }
    }
    Ok((policy, max))
}

/// A name a user gives their volume or template: 1 to 64 letters, digits and `- _ .`,
/// starting with a letter or digit (it goes in paths and command lines as it is).
pub fn resource_name(name: &str) -> Result<(), ApiError> {
    let ok = name.len() <= 64
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        return Err(ApiError::Invalid(format!(
            "name: 1 to 64 letters, digits and - _ ., starting with a letter or digit (got {name:?})"
        )));
    }
    Ok(())
}

/// Identifies a request body for idempotency: the same key with another body is refused.
pub(crate) fn request_hash<T: serde::Serialize>(body: &T) -> String {
    let json = serde_json::to_vec(body).unwrap_or_default();
    hex::encode(Sha256::digest(&json))
}

pub fn user(body: &CreateUser) -> Result<(String, Role, Money), ApiError> {
    // Not trimmed: "alice\r" is not alice.
    let name = body.name.as_str();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if !valid {
        return Err(invalid(
            "name must be 1-64 characters of letters, digits and _ - . @",
        ));
    }
    let credit = match body.credit {
        Some(c) if c == Money::ZERO => c,
        Some(c) => grant_amount(c)
            .map_err(|_| invalid(format!("credit must be from 0 to {MAX_GRANT_UNITS}")))?,
        None => Money::ZERO,
    };
    Ok((name.to_owned(), body.role.unwrap_or(Role::Tenant), credit))
}

/// The most credit an admin may grant at once.
const MAX_GRANT_UNITS: i64 = 1_000_000_000;

/// The most a GPU's memory may be declared as: 1 TiB, four times the largest GPU sold.
pub const MAX_GPU_VRAM_MB: u64 = 1024 * 1024;
const MAX_GPU_TEXT: usize = 128;
/// GPUs one agent may declare: far more than any host has (simulated fleets use 256).
const MAX_GPUS_PER_NODE: usize = 256;
const MAX_GPU_INDEX: u32 = 1023;

/// What an agent may declare of its GPUs (at registration and in every sync): a host's
/// claims are billed to tenants, so each is bounded, and names are printable.
pub fn inventory(gpus: &[GpuInfo]) -> Result<(), ApiError> {
    if gpus.len() > MAX_GPUS_PER_NODE {
        return Err(invalid(format!(
            "at most {MAX_GPUS_PER_NODE} GPUs per node (the agent declared {})",
            gpus.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, g) in gpus.iter().enumerate() {
        let at = format!("gpus[{i}]");
        let graphic = !g.uuid.is_empty()
            && g.uuid.len() <= MAX_GPU_TEXT
            && g.uuid.bytes().all(|b| b.is_ascii_graphic());
        if !graphic {
            return Err(invalid(format!(
                "{at}.uuid must be 1-{MAX_GPU_TEXT} printable ASCII characters without spaces"
            )));
        }
        if !seen.insert(g.uuid.as_str()) {
            return Err(invalid(format!("{at}.uuid {} is declared twice", g.uuid)));
        }
        if g.model.trim().is_empty() || g.model.len() > MAX_GPU_TEXT {
            return Err(invalid(format!(
                "{at}.model must be 1-{MAX_GPU_TEXT} characters"
            )));
        }
        printable(&format!("{at}.model"), &g.model)?;
        if g.vram_mb == 0 || g.vram_mb > MAX_GPU_VRAM_MB {
            return Err(invalid(format!(
                "{at}.vram_mb must be from 1 to {MAX_GPU_VRAM_MB} (1 TiB); the agent declared {}",
                g.vram_mb
            )));
        }
        if g.index > MAX_GPU_INDEX {
            return Err(invalid(format!(
                "{at}.index must be at most {MAX_GPU_INDEX}"
            )));
        }
    }
    Ok(())
}

/// Credit an admin may grant at once: positive and at most a billion.
pub fn grant_amount(amount: Money) -> Result<Money, ApiError> {
    if amount <= Money::ZERO || amount > Money::units(MAX_GRANT_UNITS) {
        return Err(invalid(format!(
            "amount must be more than 0 and at most {MAX_GRANT_UNITS}"
        )));
    }
    Ok(amount)
}

/// Published HTTP ports: at most [`MAX_HTTP_PORTS`], each from 1 to 65535, each once.
fn http_ports(ports: &[u16]) -> Result<(), ApiError> {
    if ports.len() > MAX_HTTP_PORTS {
        return Err(invalid(format!(
            "http_ports: at most {MAX_HTTP_PORTS} ports, not {}",
            ports.len()
        )));
    }
    if ports.contains(&0) {
        return Err(invalid("http_ports: 0 is not a port (give 1 to 65535)"));
    }
    if let Some((_, p)) = ports
        .iter()
        .enumerate()
        .find(|(i, p)| ports[..*i].contains(p))
    {
        return Err(invalid(format!("http_ports: {p} is given twice")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: serde_json::Value) -> CreateReservation {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn every_bad_value_names_its_field() {
        let cases = [
            (serde_json::json!({"gpu_type": "", "hours": 1}), "gpu_type"),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 0}),
                "hours",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": -1}),
                "hours",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1e9}),
                "hours",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 0}),
                "gpu_count",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 100000}),
                "gpu_count",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 0}),
                "vram_gb",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 1, "vram_gb": 8}),
                "vram_gb",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 0}),
                "vram_fraction",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 1.5}),
                "vram_fraction",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 0.5, "vram_gb": 8}),
                "vram_fraction",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "vram_fraction": 0.5, "gpu_count": 1}),
                "gpu_count",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "env": {"1X": "y"}}),
                "env",
            ),
            (
                serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "image": "a b"}),
                "image",
            ),
        ];
        for (json, field) in cases {
            let err = reservation("t", &body(json.clone()), None, None).unwrap_err();
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
        let ok = reservation(
            "t",
            &body(serde_json::json!({"gpu_type": "RTX 4090", "hours": 0.5})),
            None,
            None,
        );
        assert!(matches!(
            ok,
            Ok(NewReservation {
                duration_s: 1800,
                want: Want::Whole { count: 1 },
                ..
            })
        ));
    }

    fn share_of(json: serde_json::Value, card_mb: Option<u64>) -> Result<Want, String> {
        reservation("t", &body(json), None, card_mb)
            .map(|n| n.want)
            .map_err(|e| e.to_string())
    }

    /// A share of N GB fits a card whose memory rounds to N GB: 24 on a 24,564 MiB RTX 4090 is
    /// all of it. More than the card stays as asked (the store refuses it, naming the card).
    #[test]
    fn a_share_is_sized_against_the_card() {
        let card = Some(24_564);
        let gb = |n: u32| serde_json::json!({"gpu_type": "RTX 4090", "hours": 1, "vram_gb": n});
        let fraction =
            |f: f64| serde_json::json!({"gpu_type": "RTX 4090", "hours": 1, "vram_fraction": f});
        assert_eq!(share_of(gb(24), card), Ok(Want::Share { vram_mb: 24_564 }));
        assert_eq!(share_of(gb(12), card), Ok(Want::Share { vram_mb: 12_288 }));
        assert_eq!(share_of(gb(25), card), Ok(Want::Share { vram_mb: 25_600 }));
        // No node has the type yet: as asked (it may queue for one).
        assert_eq!(share_of(gb(24), None), Ok(Want::Share { vram_mb: 24_576 }));
        assert_eq!(
            share_of(fraction(0.5), card),
            Ok(Want::Share { vram_mb: 12_282 })
        );
        assert_eq!(
            share_of(fraction(1.0), card),
            Ok(Want::Share { vram_mb: 24_564 })
        );
        assert_eq!(
            share_of(fraction(0.333), card),
            Ok(Want::Share { vram_mb: 8_179 })
        );
        let err = share_of(fraction(0.5), None).unwrap_err();
        assert!(err.contains("no node has a GPU of type RTX 4090"), "{err}");
    }
}
