//! The CLI's `open ID PORT`: a one-time link to a published HTTP port, for a browser.

use gpurent_types::api::{CreateProxyLink, ProxyLink};

use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::output::{print_json, print_line};

pub async fn open(
    api: &ApiClient,
    id: &str,
    port: u16,
    browser: bool,
    json: bool,
) -> Result<(), CliError> {
    let path = format!("/api/v1/reservations/{}/proxy-links", segment(id));
    let link: ProxyLink = api.post(&path, &CreateProxyLink { port }, None).await?;
    if json {
        print_json(&link)?;
    } else {
        print_line(&link.url);
        eprintln!(
            "Open it within 5 minutes, once, in a browser logged in to the console as you: it \
             goes on to the app at {}. In anyone else's browser it does nothing.",
            link.app_url
        );
    }
    if browser {
        // The link is printed first: where no browser starts, it can still be copied.
        match std::process::Command::new("xdg-open")
            .arg(&link.url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("xdg-open could not open the link ({status}); open it yourself")
            }
            Err(e) => eprintln!("cannot run xdg-open ({e}); open the link yourself"),
        }
    }
    Ok(())
}
