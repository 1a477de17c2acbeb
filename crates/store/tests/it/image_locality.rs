//! The image-locality bonus, on both stores: among nodes that fit a reservation equally, one
//! whose Engine has its image (as its agent reported, `:latest` where the name has no tag);
//! never over a tighter fit.

use gpurent_billing::PriceList;
use gpurent_store::prelude::*;
use gpurent_store::{Backend, NewReservation};

use crate::support::{one_gpu, t0, Fixture};

fn with_image(tenant: &str, image: &str) -> NewReservation {
    NewReservation {
        image: Some(image.to_owned()),
        command: vec!["true".into()],
        ..one_gpu(tenant)
    }
}

async fn node_of(f: &Fixture, tenant: &str, image: &str) -> String {
    let (r, _) = f
        .store
        .reserve(
            with_image(tenant, image),
            &PriceList::defaults(),
            t0(),
            t0(),
            &[],
        )
        .await
        .expect("reserve");
    r.node.expect("placed")
}

async fn a_node_with_the_image_wins_a_tie_and_never_a_better_fit(backend: Backend) {
    // Each way round: the tie goes to the node that has the image, whichever it is.
    for (with, without) in [("a", "b"), ("b", "a")] {
        let f = Fixture::new(backend).await;
        let ids = [
            ("a", f.node("a", "NVIDIA GeForce RTX 4090", 2).await),
            ("b", f.node("b", "NVIDIA GeForce RTX 4090", 2).await),
        ];
        let id = |name: &str| ids.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        let alice = f.user("alice", "100").await;
        f.store
            .set_node_images(&id(with), &["team/train:latest".to_owned()])
            .await
            .unwrap();
        f.store
            .set_node_images(&id(without), &["team/other:1".to_owned()])
            .await
            .unwrap();
        // No tag: the Engine lists it as :latest.
        assert_eq!(node_of(&f, &alice, "team/train").await, with);
        // Now `with` is the tighter fit (one GPU free of two): the image on `without` does not
        // take the work from it.
        assert_eq!(node_of(&f, &alice, "team/other:1").await, with);
        // `with` is full: the other one.
        assert_eq!(node_of(&f, &alice, "team/train:latest").await, without);
    }
}

#[tokio::test]
async fn a_node_with_the_image_wins_a_tie_and_never_a_better_fit_sqlite() {
    a_node_with_the_image_wins_a_tie_and_never_a_better_fit(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_node_with_the_image_wins_a_tie_and_never_a_better_fit_postgres() {
    a_node_with_the_image_wins_a_tie_and_never_a_better_fit(Backend::Postgres).await;
}
