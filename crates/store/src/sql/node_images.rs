//! The images each node has, as its agent reports them, and which nodes have an image (the
//! placement's image-locality bonus: among equal fits, a node that has it).

use std::collections::BTreeSet;

use gpurent_types::agent::image_with_tag;
use sqlx::{AnyConnection, Row};

use super::SqlStore;
use crate::{Result, StoreError};

pub(super) async fn set(store: &SqlStore, node_id: &str, images: &[String]) -> Result<()> {
    let json = serde_json::to_string(images)
        .map_err(|e| StoreError::Corrupt(format!("node images: {e}")))?;
    sqlx::query("UPDATE nodes SET images = $1 WHERE id = $2")
        .bind(json)
        .bind(node_id)
        .execute(&store.pool)
        .await?;
    Ok(())
}

/// `text` for a LIKE pattern with `\` as its escape.
fn escape_like(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// The nodes whose Engine has `image` (`:latest` where it names no tag).
pub(super) async fn having(conn: &mut AnyConnection, image: &str) -> Result<BTreeSet<String>> {
    let tagged = image_with_tag(image);
    let quoted = serde_json::to_string(&tagged)
        .map_err(|e| StoreError::Corrupt(format!("image name: {e}")))?;
    let rows = sqlx::query("SELECT id, images FROM nodes WHERE images LIKE $1 ESCAPE '\\'")
        .bind(format!("%{}%", escape_like(&quoted)))
        .fetch_all(&mut *conn)
        .await?;
    let mut nodes = BTreeSet::new();
    for row in rows {
        let images: Vec<String> =
            serde_json::from_str(&row.try_get::<String, _>("images")?).unwrap_or_default();
        if images.contains(&tagged) {
            nodes.insert(row.try_get("id")?);
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns_escape_their_wildcards() {
        assert_eq!(escape_like(r#""a_b%c\d""#), r#""a\_b\%c\\d""#);
    }
}
