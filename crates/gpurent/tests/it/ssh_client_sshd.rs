//! gpurent's own SSH client (`gpurent cp`, `gpurent port-forward`) against OpenSSH's sshd on
//! loopback, pointed at it with the hidden `--direct` flags instead of a control plane's
//! endpoint: the same code the commands run, with a real SSH and SFTP server on the other end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ssh_support::{keygen, mode, random_file, sha256, Guard, Home, Sshd};

/// `gpurent cp` (with `--direct` to `sshd` and `-i key` when given) in `home`.
fn cp(
    home: &Home,
    sshd: &Sshd,
    key: Option<&std::path::Path>,
    args: &[&str],
) -> crate::support::Run {
    let mut all: Vec<String> = vec!["--json".into(), "cp".into()];
    all.extend(sshd.direct());
    if let Some(key) = key {
        all.extend(["-i".to_owned(), key.display().to_string()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    home.gpurent(&[], &all)
}

#[test]
fn cp_copies_files_and_trees_both_ways_with_their_modes() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "client", "");
    let sshd = Sshd::start(dir.path(), &[&public]);
    let remote = dir.path().join("remote");
    std::fs::create_dir(&remote).unwrap();

    // One file of 1.5 MiB, mode 0751: up, then down again.
    let local = dir.path().join("data.bin");
    random_file(&local, 1536 * 1024 + 7, 1);
    std::fs::set_permissions(&local, std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
    let dest = format!("{}:{}/up.bin", sshd.user, remote.display());
    let up = cp(&home, &sshd, Some(&key), &[local.to_str().unwrap(), &dest]);
    assert_eq!(up.code, 0, "{up:?}");
    assert_eq!(up.json()["bytes"], 1536 * 1024 + 7);
    assert_eq!(sha256(&remote.join("up.bin")), sha256(&local));
    assert_eq!(mode(&remote.join("up.bin")), 0o751);

    std::fs::set_permissions(
        remote.join("up.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let back = dir.path().join("back.bin");
    let down = cp(&home, &sshd, Some(&key), &[&dest, back.to_str().unwrap()]);
    assert_eq!(down.code, 0, "{down:?}");
    assert_eq!(sha256(&back), sha256(&local));
    assert_eq!(mode(&back), 0o640);

    // On a terminal, a big file shows its progress: bytes and rate.
    let big = dir.path().join("big.bin");
    random_file(&big, 5 * 1024 * 1024, 4);
    let mut line: Vec<String> = vec![crate::support::BIN.into(), "cp".into()];
    line.extend(sshd.direct());
    line.extend([
        "-i".into(),
        key.display().to_string(),
        big.display().to_string(),
    ]);
    line.push(format!("{}:{}/big.bin", sshd.user, remote.display()));
    // `script` gives the command a terminal; the environment is the one `home` sets.
    let mut on_tty = Command::new("script");
    on_tty.args(["-q", "-e", "-c", &line.join(" "), "/dev/null"]);
    for (k, v) in home.command(&[], &[]).get_envs() {
        match v {
            Some(v) => on_tty.env(k, v),
            None => on_tty.env_remove(k),
        };
    }
    let shown = crate::ssh_support::run_bounded(on_tty);
    let screen = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{shown:?}");
    assert!(screen.contains("5.0 / 5.0 MiB"), "{screen:?}");
    assert!(screen.contains("MiB/s"), "{screen:?}");
    assert_eq!(sha256(&remote.join("big.bin")), sha256(&big));

    // Into an existing directory: under the source's name.
    let into = format!("{}:{}", sshd.user, remote.display());
    let up = cp(&home, &sshd, Some(&key), &[local.to_str().unwrap(), &into]);
    assert_eq!(up.code, 0, "{up:?}");
    assert_eq!(sha256(&remote.join("data.bin")), sha256(&local));

    // A tree, without -r refused, with -r copied both ways (a symlink is skipped and said).
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    random_file(&tree.join("a.bin"), 70_000, 2);
    random_file(&tree.join("sub/deeper/b.bin"), 1, 3);
    std::fs::write(tree.join("sub/empty"), b"").unwrap();
    std::os::unix::fs::symlink("a.bin", tree.join("link")).unwrap();
    std::fs::set_permissions(
        tree.join("sub"),
        std::os::unix::fs::PermissionsExt::from_mode(0o710),
    )
    .unwrap();
    let no_r = cp(&home, &sshd, Some(&key), &[tree.to_str().unwrap(), &into]);
    assert_ne!(no_r.code, 0, "{no_r:?}");
    assert!(
        no_r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("give -r"),
        "{no_r:?}"
    );
    let up = cp(
        &home,
        &sshd,
        Some(&key),
        &["-r", tree.to_str().unwrap(), &into],
    );
    assert_eq!(up.code, 0, "{up:?}");
    assert_eq!(up.json()["bytes"], 70_001);
    assert!(
        up.stderr.contains("skipped") && up.stderr.contains("link"),
        "{up:?}"
    );
    let copied = remote.join("tree");
    assert_eq!(sha256(&copied.join("a.bin")), sha256(&tree.join("a.bin")));
    assert_eq!(
        sha256(&copied.join("sub/deeper/b.bin")),
        sha256(&tree.join("sub/deeper/b.bin"))
    );
    assert_eq!(std::fs::read(copied.join("sub/empty")).unwrap(), b"");
    assert_eq!(mode(&copied.join("sub")), 0o710);
    assert!(!copied.join("link").exists());

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let src = format!("{}:{}", sshd.user, copied.display());
    let down = cp(
        &home,
        &sshd,
        Some(&key),
        &["-r", &src, out.to_str().unwrap()],
    );
    assert_eq!(down.code, 0, "{down:?}");
    assert_eq!(
        sha256(&out.join("tree/sub/deeper/b.bin")),
        sha256(&tree.join("sub/deeper/b.bin"))
    );
    assert_eq!(sha256(&out.join("tree/a.bin")), sha256(&tree.join("a.bin")));
    assert_eq!(mode(&out.join("tree/sub")), 0o710);

    // Neither side remote, and a missing source: said, not attempted.
    let both_local = cp(&home, &sshd, Some(&key), &["a", "b"]);
    assert!(both_local.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("ID:PATH"));
    let missing = format!("{}:{}/nothing-here", sshd.user, remote.display());
    let gone = cp(&home, &sshd, Some(&key), &[&missing, out.to_str().unwrap()]);
    assert_ne!(gone.code, 0);
    assert!(
        gone.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing-here"),
        "{gone:?}"
    );
}

#[test]
fn cp_refuses_a_server_whose_host_key_is_not_the_pinned_one() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "client", "");
    let sshd = Sshd::start(dir.path(), &[&public]);
    let local = dir.path().join("f");
    std::fs::write(&local, b"secret").unwrap();
    let dest = format!("{}:{}/f2", sshd.user, dir.path().display());
    // The client's own public key stands for "some other key" pinned by the control plane.
    let mut args: Vec<String> = vec!["--json".into(), "cp".into(), "-i".into()];
    args.push(key.display().to_string());
    args.extend([
        "--direct".into(),
        format!("127.0.0.1:{}", sshd.port),
        "--direct-host-key".into(),
        public.display().to_string(),
    ]);
    args.extend([local.display().to_string(), dest]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = home.gpurent(&[], &args);
    assert_ne!(refused.code, 0, "{refused:?}");
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "host_key_mismatch", "{refused:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("refusing to connect"),
        "{refused:?}"
    );
    assert!(!dir.path().join("f2").exists(), "nothing may be sent");
}

#[test]
fn cp_logs_in_with_the_agent_or_a_default_key_and_explains_an_encrypted_one() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "agent_key", "");
    let (locked, locked_pub) = keygen(dir.path(), "locked", "a passphrase");
    let (default_key, default_pub) = keygen(dir.path(), "default_key", "");
    let sshd = Sshd::start(dir.path(), &[&public, &locked_pub, &default_pub]);
    let local = dir.path().join("f");
    std::fs::write(&local, b"hello").unwrap();
    let dest = |name: &str| format!("{}:{}/{name}", sshd.user, dir.path().display());

    // No key anywhere: says so, and how to add one.
    let none = cp(&home, &sshd, None, &[local.to_str().unwrap(), &dest("x")]);
    assert_ne!(none.code, 0, "{none:?}");
    assert_eq!(none.json()["error"]["code"], "ssh_auth_failed", "{none:?}");
    assert!(none.stdout.contains("gpurent keys add"), "{none:?}");

    // An encrypted key and no agent: a clear message, not a prompt.
    let enc = cp(
        &home,
        &sshd,
        Some(&locked),
        &[local.to_str().unwrap(), &dest("x")],
    );
    assert_ne!(enc.code, 0, "{enc:?}");
    assert!(
        enc.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs a passphrase"),
        "{enc:?}"
    );

    // ~/.ssh/id_ed25519 when nothing else is given.
    let ssh_dir = home.home.join(".ssh");
    std::fs::create_dir_all(&ssh_dir).unwrap();
    std::fs::copy(&default_key, ssh_dir.join("id_ed25519")).unwrap();
    let by_default = cp(
        &home,
        &sshd,
        None,
        &[local.to_str().unwrap(), &dest("by_default")],
    );
    assert_eq!(by_default.code, 0, "{by_default:?}");
    assert_eq!(
        std::fs::read(dir.path().join("by_default")).unwrap(),
        b"hello"
    );
    std::fs::remove_file(ssh_dir.join("id_ed25519")).unwrap();

    // An ssh-agent's key (SSH_AUTH_SOCK).
    let sock = dir.path().join("agent.sock");
    let agent = Guard(
        Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ssh-agent"),
    );
    crate::support::eventually("the agent's socket", 10, || sock.exists());
    let added = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &sock)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let mut args: Vec<String> = vec!["--json".into(), "cp".into()];
    args.extend(sshd.direct());
    args.extend([local.display().to_string(), dest("by_agent")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let by_agent = home.gpurent(&[("SSH_AUTH_SOCK", &sock)], &args);
    assert_eq!(by_agent.code, 0, "{by_agent:?}");
    assert_eq!(
        std::fs::read(dir.path().join("by_agent")).unwrap(),
        b"hello"
    );
    drop(agent);
}

/// A TCP echo server on a free loopback port; its threads end with the test process.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let mut writer = stream;
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    port
}

/// Starts `gpurent port-forward` and waits for its `forwarding 127.0.0.1:L -> ...` line: the
/// process and L.
pub fn start_forward(
    home: &Home,
    env: &[(&str, &std::path::Path)],
    args: &[&str],
) -> (Guard, u16, String) {
    let mut child = home
        .command(env, args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpurent port-forward");
    let stderr = child.stderr.take().unwrap();
    let guard = Guard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("forwarding 127.0.0.1:") {
                    let port = rest.split(' ').next().unwrap().parse().unwrap();
                    return (guard, port, line);
                }
                seen.push(line);
            }
            Err(_) => panic!("no forwarding line; stderr: {seen:?}"),
        }
    }
}

#[test]
fn port_forward_carries_connections_to_a_server_behind_sshd_until_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "client", "");
    let sshd = Sshd::start(dir.path(), &[&public]);
    let echo = echo_server();
    let mut args: Vec<String> = vec![
        "port-forward".into(),
        "-i".into(),
        key.display().to_string(),
    ];
    args.extend(sshd.direct());
    args.extend([sshd.user.clone(), format!("0:{echo}")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut forward, port, line) = start_forward(&home, &[], &args);
    assert_ne!(port, 0);
    assert_eq!(
        line,
        format!("forwarding 127.0.0.1:{port} -> {}:{echo}", sshd.user)
    );

    // Two connections at once, each a 256 KiB round trip that must come back whole.
    let round_trip = |seed: u8| {
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let sent: Vec<u8> = (0..256 * 1024)
                .map(|i: u32| i.to_le_bytes()[0].wrapping_mul(seed))
                .collect();
            let mut writer = stream.try_clone().unwrap();
            let expected = sent.clone();
            let sender = std::thread::spawn(move || {
                writer.write_all(&sent).unwrap();
                writer.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut got = Vec::new();
            stream.read_to_end(&mut got).unwrap();
            sender.join().unwrap();
            assert_eq!(got.len(), expected.len());
            assert!(got == expected, "the echo differs");
        })
    };
    let (a, b) = (round_trip(3), round_trip(7));
    a.join().unwrap();
    b.join().unwrap();

    // SIGINT: a clean exit.
    let pid = forward.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let mut status = None;
    crate::support::eventually("port-forward to exit after SIGINT", 20, || {
        status = forward.0.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{status:?}");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still listening"
    );
}
