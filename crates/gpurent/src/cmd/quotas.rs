//! The CLI's `quotas set|ls|rm`.

use gpurent_types::api::{QuotaInfo, SetQuota};

use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::QuotasCommand;
use crate::output::{print_json, print_line, print_table};

pub async fn quotas(api: &ApiClient, command: QuotasCommand, json: bool) -> Result<(), CliError> {
    match command {
        QuotasCommand::Set {
            team,
            gpu,
            gpus,
            borrow_limit,
        } => {
            let body = SetQuota {
                team,
                gpu_type: gpu,
                gpus,
                borrow_limit,
            };
            let q: QuotaInfo = api.put("/api/v1/quotas", &body).await?;
            if json {
                return print_json(&q);
            }
            print_line(&format!(
                "{} has {} {} GPUs guaranteed, may borrow {} more; uses {} now",
                q.team,
                q.gpus,
                q.gpu_type,
                q.borrow_limit.as_deref().unwrap_or("any idle"),
                q.used
            ));
        }
        QuotasCommand::Ls => {
            let all: Vec<QuotaInfo> = api.get("/api/v1/quotas").await?;
            if json {
                return print_json(&all);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|q| {
                    vec![
                        q.team.clone(),
                        q.gpu_type.clone(),
                        q.gpus.clone(),
                        q.borrow_limit
                            .clone()
                            .unwrap_or_else(|| "any idle".to_owned()),
                        q.used.clone(),
                    ]
                })
                .collect();
            print_table(&["TEAM", "GPU", "GUARANTEED", "MAY BORROW", "USED"], &rows);
        }
        QuotasCommand::Rm { team, gpu } => {
            let path = format!(
                "/api/v1/quotas?team={}&gpu_type={}",
                segment(&team),
                segment(&gpu)
            );
            api.delete_no_content(&path).await?;
            if json {
                return print_json(&serde_json::json!({"removed": true}));
            }
            print_line(&format!("removed {team}'s quota of {gpu}"));
        }
    }
    Ok(())
}
