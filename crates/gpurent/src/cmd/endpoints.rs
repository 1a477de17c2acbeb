//! The CLI's `endpoints create|ls|get|update|rm|logs|keys`: apps behind one URL, their
//! replicas (reservations) scaled with their traffic.

use std::collections::BTreeMap;

use gpurent_types::api::{
    CreateEndpoint, Endpoint, EndpointKey, EndpointKeyCreated, EndpointReplica, EndpointScaling,
    UpdateEndpoint,
};
use gpurent_types::{ReservationStatus, Tier};

use super::access::time;
use super::client::{reservation_logs, segment};
use crate::api_client::{ApiClient, CliError};
use crate::cli::{EndpointCreateArgs, EndpointKeysCommand, EndpointUpdateArgs, EndpointsCommand};
use crate::output::{print_json, print_line, print_table};

/// A duration as seconds: `90`, `90s`, `5m` or `1h`.
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration: a whole number of seconds, or one followed by s, m or h \
             (90, 90s, 5m, 1h)"
        )
    };
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_lowercase()),
        _ => (t, 's'),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).ok_or_else(bad)
}

fn seconds(flag: &str, text: &str) -> Result<u64, CliError> {
    parse_duration(text).map_err(|e| CliError::new("invalid_value", format!("{flag} {e}")))
}

/// `--env K=V` flags as an environment (as `reserve` reads them).
fn env_of(kvs: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut env = BTreeMap::new();
    for kv in kvs {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| CliError::new("invalid_value", format!("--env {kv:?} is not K=V")))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    Ok(env)
}

/// The body of `POST /api/v1/endpoints` for `endpoints create`.
pub(crate) fn create_body(args: EndpointCreateArgs) -> Result<CreateEndpoint, CliError> {
    if args.image.is_none() && args.template.is_none() && args.command.is_empty() {
        return Err(CliError::new(
            "invalid_value",
            "what should its replicas run? Give --image, --template or a command after `--`",
        ));
    }
    let tier = args
        .tier
        .as_deref()
        .map(|t| {
            t.parse::<Tier>()
                .map_err(|e| CliError::new("invalid_value", e.to_string()))
        })
        .transpose()?;
    Ok(CreateEndpoint {
        name: args.name,
        gpu_type: args.gpu,
        gpu_count: args.count,
        vram_gb: args.vram_gb,
        tier,
        image: args.image,
        command: args.command,
        env: env_of(&args.env)?,
        template: args.template,
        port: args.port,
        scaling: EndpointScaling {
            min_replicas: args.min_replicas,
            max_replicas: args.max_replicas,
            target_inflight: args.target_inflight,
            scale_down_after_s: seconds("--scale-down-after", &args.scale_down_after)?,
            health_path: args.health_path,
            public: args.public,
            queue_timeout_s: seconds("--queue-timeout", &args.queue_timeout)?,
            max_queue: args.max_queue,
            max_body_mb: args.max_body_mb,
        },
    })
}

/// The endpoint's name and the body of its `PATCH`: only what a flag was given for.
pub(crate) fn update_body(args: EndpointUpdateArgs) -> Result<(String, UpdateEndpoint), CliError> {
    let body = UpdateEndpoint {
        image: args.image,
        command: (!args.command.is_empty()).then_some(args.command),
        env: if args.env.is_empty() {
            None
        } else {
            Some(env_of(&args.env)?)
        },
        min_replicas: args.min_replicas,
        max_replicas: args.max_replicas,
        target_inflight: args.target_inflight,
        scale_down_after_s: args
            .scale_down_after
            .as_deref()
            .map(|d| seconds("--scale-down-after", d))
            .transpose()?,
        health_path: args.health_path,
        public: args.public,
        queue_timeout_s: args
            .queue_timeout
            .as_deref()
            .map(|d| seconds("--queue-timeout", d))
            .transpose()?,
        max_queue: args.max_queue,
        max_body_mb: args.max_body_mb,
    };
    if body == UpdateEndpoint::default() {
        return Err(CliError::new(
            "invalid_value",
            "nothing to change: give at least one flag (gpurent endpoints update --help)",
        ));
    }
    Ok((args.name, body))
}

/// The replica whose log `endpoints logs` reads: the one of index `index`, else the newest
/// running one, else the newest.
pub(crate) fn pick_replica(e: &Endpoint, index: Option<u64>) -> Result<&EndpointReplica, CliError> {
    if e.replicas.is_empty() {
        return Err(CliError::new(
            "no_replica",
            format!(
                "endpoint {} has no replica yet: it starts one at its first request",
                e.name
            ),
        ));
    }
    if let Some(n) = index {
        return e.replicas.iter().find(|r| r.index == n).ok_or_else(|| {
            let known: Vec<String> = e.replicas.iter().map(|r| r.index.to_string()).collect();
            CliError::new(
                "not_found",
                format!(
                    "endpoint {} has no replica {n} (its replicas: {})",
                    e.name,
                    known.join(", ")
                ),
            )
        });
    }
    let newest = |running: bool| {
        e.replicas
            .iter()
            .filter(|r| !running || r.status == ReservationStatus::Running)
            .max_by_key(|r| r.index)
    };
    newest(true)
        .or_else(|| newest(false))
        .ok_or_else(|| CliError::new("no_replica", format!("endpoint {} has no replica", e.name)))
}

fn path_of(name: &str) -> String {
    format!("/api/v1/endpoints/{}", segment(name))
}

pub async fn endpoints(
    api: &ApiClient,
    command: EndpointsCommand,
    json: bool,
) -> Result<(), CliError> {
    match command {
        EndpointsCommand::Create(args) => {
            let body = create_body(*args)?;
            let e: Endpoint = api.post("/api/v1/endpoints", &body, None).await?;
            if json {
                return print_json(&e);
            }
            print_endpoint(&e);
        }
        EndpointsCommand::Ls => {
            let es: Vec<Endpoint> = api.get_all("/api/v1/endpoints").await?;
            if json {
                return print_json(&es);
            }
            let rows: Vec<Vec<String>> = es
                .iter()
                .map(|e| {
                    vec![
                        e.name.clone(),
                        state(e),
                        format!("{}/{}", e.ready_replicas, e.replicas.len()),
                        e.url.clone(),
                    ]
                })
                .collect();
            print_table(&["NAME", "STATUS", "READY", "URL"], &rows);
        }
        EndpointsCommand::Get { name } => {
            let e: Endpoint = api.get(&path_of(&name)).await?;
            if json {
                return print_json(&e);
            }
            print_endpoint(&e);
        }
        EndpointsCommand::Update(args) => {
            let (name, body) = update_body(*args)?;
            let e: Endpoint = api.patch(&path_of(&name), &body).await?;
            if json {
                return print_json(&e);
            }
            print_endpoint(&e);
        }
        EndpointsCommand::Rm { name } => {
            let e: Endpoint = api.delete(&path_of(&name)).await?;
            if json {
                return print_json(&e);
            }
            print_line(&format!(
                "removed endpoint {}; its replicas stop and its keys no longer work",
                e.name
            ));
        }
        EndpointsCommand::Logs {
            name,
            replica,
            follow,
        } => {
            let e: Endpoint = api.get(&path_of(&name)).await?;
            let r = pick_replica(&e, replica)?;
            // On stderr: stdout is the log's bytes as they are.
            eprintln!(
                "replica {} of endpoint {} (reservation {}, {})",
                r.index, e.name, r.id, r.status
            );
            reservation_logs(api, &r.id, follow, None).await?;
        }
        EndpointsCommand::Keys(command) => keys(api, command, json).await?,
    }
    Ok(())
}

async fn keys(api: &ApiClient, command: EndpointKeysCommand, json: bool) -> Result<(), CliError> {
    match command {
        EndpointKeysCommand::Create { name } => {
            let k: EndpointKeyCreated = api
                .post(
                    &format!("{}/keys", path_of(&name)),
                    &serde_json::json!({}),
                    None,
                )
                .await?;
            if json {
                return print_json(&k);
            }
            print_line(&k.key);
            eprintln!(
                "key {} of endpoint {name}: send it as `Authorization: Bearer KEY`; it is not \
                 shown again",
                k.id
            );
        }
        EndpointKeysCommand::Ls { name } => {
            let ks: Vec<EndpointKey> = api.get_all(&format!("{}/keys", path_of(&name))).await?;
            if json {
                return print_json(&ks);
            }
            let rows: Vec<Vec<String>> = ks
                .iter()
                .map(|k| {
                    vec![
                        k.id.clone(),
                        format!("{}...", k.prefix),
                        time(Some(k.created_at)),
                    ]
                })
                .collect();
            print_table(&["ID", "PREFIX", "CREATED"], &rows);
        }
        EndpointKeysCommand::Rm { name, id } => {
            api.delete_no_content(&format!("{}/keys/{}", path_of(&name), segment(&id)))
                .await?;
            if json {
                return print_json(&serde_json::json!({ "removed": id }));
            }
            print_line(&format!("revoked key {id} of endpoint {name}"));
        }
    }
    Ok(())
}

fn state(e: &Endpoint) -> String {
    match &e.message {
        Some(m) => format!("{}: {m}", e.status.as_str()),
        None => e.status.as_str().to_owned(),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"))
}

/// What `create`, `get` and `update` print: settings, replicas, figures.
fn print_endpoint(e: &Endpoint) {
    let field = |label: &str, value: &str| print_line(&format!("{label:<11} {value}"));
    let s = &e.scaling;
    field("name:", &e.name);
    field("url:", &e.url);
    field("app url:", &e.app_url);
    field("status:", &state(e));
    field(
        "shape:",
        &match e.vram_gb {
            Some(gb) => format!("{gb} GB of one {} ({})", e.gpu_type, e.tier),
            None => format!("{}x {} ({})", e.gpu_count, e.gpu_type, e.tier),
        },
    );
    field("image:", e.image.as_deref().unwrap_or("- (a process)"));
    field(
        "command:",
        &if e.command.is_empty() {
            "-".to_owned()
        } else {
            e.command.join(" ")
        },
    );
    if !e.env.is_empty() {
        field("env:", &e.env.join(", "));
    }
    field("port:", &e.port.to_string());
    field(
        "scaling:",
        &format!(
            "{}-{} replicas, {} in flight each, down after {}s quiet; health {}",
            s.min_replicas, s.max_replicas, s.target_inflight, s.scale_down_after_s, s.health_path
        ),
    );
    field(
        "requests:",
        &format!(
            "{}; up to {} queued for {}s; bodies up to {} MiB",
            if s.public {
                "public (no key)"
            } else {
                "with a key"
            },
            s.max_queue,
            s.queue_timeout_s,
            s.max_body_mb
        ),
    );
    field("generation:", &e.generation.to_string());
    field("created:", &time(Some(e.created_at)));
    if e.replicas.is_empty() {
        print_line("no replica: the next request starts one");
    } else {
        let rows: Vec<Vec<String>> = e
            .replicas
            .iter()
            .map(|r| {
                vec![
                    r.index.to_string(),
                    r.id.clone(),
                    r.status.to_string(),
                    if r.ready { "yes" } else { "no" }.to_owned(),
                    r.node.clone().unwrap_or_else(|| "-".into()),
                    r.generation.to_string(),
                    r.inflight.to_string(),
                ]
            })
            .collect();
        print_table(
            &[
                "REPLICA",
                "RESERVATION",
                "STATUS",
                "READY",
                "NODE",
                "GENERATION",
                "INFLIGHT",
            ],
            &rows,
        );
    }
    let f = &e.figures;
    print_line(&format!(
        "requests: {} ({:.2}/s over the last minute), p50 {}, p99 {}; {} in flight, {} queued",
        f.requests,
        f.requests_per_s,
        ms(f.p50_ms),
        ms(f.p99_ms),
        f.inflight,
        f.queued
    ));
    print_line(&format!(
        "queue wait: p50 {}, p99 {}; cold starts: {} (p50 {}, p99 {}); rejected: {}",
        ms(f.queue_wait_p50_ms),
        ms(f.queue_wait_p99_ms),
        f.cold_starts,
        ms(f.cold_start_p50_ms),
        ms(f.cold_start_p99_ms),
        f.rejected
    ));
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{ApiCommand, Cli, Command};

    /// `line` (words split at spaces) as `gpurent endpoints LINE`.
    fn parse(line: &str) -> Result<EndpointsCommand, clap::Error> {
        let words = ["gpurent", "endpoints"]
            .into_iter()
            .chain(line.split_whitespace());
        match Cli::try_parse_from(words)?.command {
            Command::Api(ApiCommand::Endpoints(c)) => Ok(c),
            other => panic!("not an endpoints command: {other:?}"),
        }
    }

    fn create(line: &str) -> Result<CreateEndpoint, CliError> {
        match parse(&format!("create x --gpu rtx4090 --port 8000 {line}")) {
            Ok(EndpointsCommand::Create(args)) => create_body(*args),
            other => panic!("not create: {other:?}"),
        }
    }

    fn update(line: &str) -> Result<(String, UpdateEndpoint), CliError> {
        match parse(&format!("update x {line}")) {
            Ok(EndpointsCommand::Update(args)) => update_body(*args),
            other => panic!("not update: {other:?}"),
        }
    }

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("5m"), Ok(300));
        assert_eq!(parse_duration("1h"), Ok(3600));
        assert_eq!(parse_duration("0"), Ok(0));
        for bad in [
            "",
            "s",
            "5d",
            "-5",
            "1.5m",
            "5 m",
            "m5",
            "99999999999999999999h",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.contains("90, 90s, 5m, 1h"), "{e}");
        }
    }

    #[test]
    fn create_takes_the_command_and_the_defaults() {
        let body = create("-- python3 -m http.server").expect("a body");
        let expected = CreateEndpoint {
            name: "x".into(),
            gpu_type: "rtx4090".into(),
            gpu_count: None,
            vram_gb: None,
            tier: None,
            image: None,
            command: vec!["python3".into(), "-m".into(), "http.server".into()],
            env: BTreeMap::new(),
            template: None,
            port: 8000,
            scaling: EndpointScaling::default(),
        };
        assert_eq!(body, expected);
    }

    #[test]
    fn create_takes_its_flags() {
        let body = create(
            "--vram-gb 12 --image img --tier spot --public --scale-down-after 5m \
             --queue-timeout 90 --env A=1 --env B=x=y",
        )
        .expect("a body");
        assert_eq!(body.vram_gb, Some(12));
        assert_eq!(body.tier, Some(Tier::Spot));
        assert!(body.scaling.public);
        assert_eq!(body.scaling.scale_down_after_s, 300);
        assert_eq!(body.scaling.queue_timeout_s, 90);
        assert_eq!(body.env.get("B").map(String::as_str), Some("x=y"));
    }

    #[test]
    fn create_refuses_what_reserve_refuses() {
        // `reserve` refuses whole GPUs and a share at once; so does this.
        let reserve = "gpurent reserve --gpu rtx4090 --hours 1 --count 2 --vram-gb 12";
        assert!(Cli::try_parse_from(reserve.split_whitespace()).is_err());
        assert!(
            parse("create x --gpu rtx4090 --port 80 --image i --count 2 --vram-gb 12").is_err()
        );

        let refused = |line: &str| create(line).expect_err(line).message;
        assert!(refused("--image i --tier cheap").contains("on-demand"));
        assert!(refused("--image i --env NOEQ").contains("is not K=V"));
        assert!(refused("--image i --queue-timeout 1d").contains("--queue-timeout"));
        assert!(refused("").contains("--image, --template"));
    }

    #[test]
    fn update_sends_only_the_flags_given() {
        let (name, body) = update("--max-replicas 8 --public false").expect("a body");
        assert_eq!(name, "x");
        let expected = UpdateEndpoint {
            max_replicas: Some(8),
            public: Some(false),
            ..UpdateEndpoint::default()
        };
        assert_eq!(body, expected);
        let sent = serde_json::to_value(&body).expect("json");
        assert_eq!(
            sent,
            serde_json::json!({"max_replicas": 8, "public": false})
        );

        let (_, body) = update("--env A=1 --scale-down-after 2m -- serve").expect("a body");
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        assert_eq!(body.env, Some(env));
        assert_eq!(body.scale_down_after_s, Some(120));
        assert_eq!(body.command, Some(vec!["serve".to_owned()]));
        let nothing = update("").expect_err("nothing to change");
        assert!(nothing.message.contains("nothing to change"));
    }

    fn endpoint(replicas: &[(u64, ReservationStatus)]) -> Endpoint {
        let replicas: Vec<_> = replicas
            .iter()
            .map(|&(index, status)| EndpointReplica {
                index,
                id: format!("r{index}"),
                status,
                ready: status == ReservationStatus::Running,
                generation: 1,
                node: None,
                started_at: None,
                inflight: 0,
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "id": "e1", "name": "x", "tenant_id": "t", "url": "u", "app_url": "a",
            "gpu_type": "rtx4090", "gpu_count": 1, "tier": "on-demand", "image": null,
            "command": [], "env": [], "port": 8000, "scaling": {}, "generation": 1,
            "status": "idle", "ready_replicas": 0, "created_at": "2025-01-01T00:00:00Z",
            "replicas": replicas, "requests": 0, "requests_per_s": 0.0, "queued": 0,
            "inflight": 0, "rejected": 0, "cold_starts": 0, "replicas_over_time": []
        }))
        .expect("an endpoint")
    }

    #[test]
    fn logs_pick_the_newest_running_replica() {
        use ReservationStatus::{Failed, Running, Starting};
        let none = pick_replica(&endpoint(&[]), None).expect_err("no replica");
        let said = "endpoint x has no replica yet: it starts one at its first request";
        assert_eq!(none.message, said);
        let e = endpoint(&[(1, Running), (2, Running), (3, Starting)]);
        let index = |n: Option<u64>| pick_replica(&e, n).map(|r| r.index).ok();
        assert_eq!(index(None), Some(2));
        assert_eq!(index(Some(3)), Some(3));
        let missing = pick_replica(&e, Some(9)).expect_err("no replica 9");
        assert!(missing.message.contains("1, 2, 3"), "{}", missing.message);
        let e = endpoint(&[(4, Failed), (5, Starting)]);
        assert_eq!(pick_replica(&e, None).map(|r| r.index).ok(), Some(5));
    }
}
