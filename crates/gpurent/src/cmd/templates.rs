//! The CLI's `templates create|ls|get|rm`.

use std::collections::BTreeMap;

use gpurent_types::api::{command_words, CreateTemplate, Template};

use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::TemplatesCommand;
use crate::output::{print_json, print_line, print_table};

const HEADER: [&str; 6] = [
    "NAME",
    "IMAGE",
    "COMMAND",
    "HTTP PORTS",
    "WHOSE",
    "DESCRIPTION",
];

fn row(t: &Template) -> Vec<String> {
    vec![
        t.name.clone(),
        t.image.clone().unwrap_or_else(|| "- (a process)".into()),
        if t.command.is_empty() {
            "-".into()
        } else {
            t.command.join(" ")
        },
        t.http_ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(","),
        match (&t.owner, t.public) {
            (_, false) => "yours".into(),
            (Some(owner), true) => format!("public ({owner})"),
            (None, true) => "public (shipped)".into(),
        },
        t.description.clone().unwrap_or_default(),
    ]
}

fn path_of(name: &str) -> String {
    format!("/api/v1/templates/{}", segment(name))
}

pub async fn templates(
    api: &ApiClient,
    command: TemplatesCommand,
    json: bool,
) -> Result<(), CliError> {
    match command {
        TemplatesCommand::Create {
            name,
            image,
            command,
            env,
            http_ports,
            volume_mount,
            description,
            public,
        } => {
            let mut vars = BTreeMap::new();
            for kv in &env {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    CliError::new("invalid_value", format!("--env {kv:?} is not K=V"))
                })?;
                vars.insert(k.to_owned(), v.to_owned());
            }
            let body = CreateTemplate {
                name,
                image,
                command: command.as_deref().map(command_words).unwrap_or_default(),
                env: vars,
                http_ports,
                volume_mount,
                description,
                public,
            };
            let t: Template = api.post("/api/v1/templates", &body, None).await?;
            if json {
                return print_json(&t);
            }
            print_line(&format!(
                "template {} made; reserve from it with gpurent reserve --template {} --gpu ...",
                t.name, t.name
            ));
        }
        TemplatesCommand::Ls => {
            let ts: Vec<Template> = api.get("/api/v1/templates").await?;
            if json {
                return print_json(&ts);
            }
            print_table(&HEADER, &ts.iter().map(row).collect::<Vec<_>>());
        }
        TemplatesCommand::Get { name } => {
            let t: Template = api.get(&path_of(&name)).await?;
            if json {
                return print_json(&t);
            }
            print_table(&HEADER, &[row(&t)]);
            for (k, v) in &t.env {
                print_line(&format!("env {k}={v}"));
            }
            if let Some(mount) = &t.volume_mount {
                print_line(&format!("a volume given without a path goes to {mount}"));
            }
        }
        TemplatesCommand::Rm { name } => {
            let t: Template = api.delete(&path_of(&name)).await?;
            if json {
                return print_json(&t);
            }
            print_line(&format!("removed template {}", t.name));
        }
    }
    Ok(())
}
