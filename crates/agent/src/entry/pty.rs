//! A PTY for a session on the node: the slave becomes the session's terminal, the master is
//! read and written by the agent without blocking (tokio's `AsyncFd`).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use nix::pty::Winsize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Pty;

nix::ioctl_write_ptr_bad!(set_window_size, libc::TIOCSWINSZ, Winsize);

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a PTY of the asked size: (master, slave).
pub fn open(pty: &Pty) -> io::Result<(OwnedFd, OwnedFd)> {
    let pair = nix::pty::openpty(Some(&winsize(pty.cols, pty.rows)), None)?;
    for fd in [&pair.master, &pair.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }
    Ok((pair.master, pair.slave))
}

/// A new window size for the terminal of `master`.
pub fn resize(master: &impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    let size = winsize(cols, rows);
    // SAFETY: TIOCSWINSZ reads one Winsize, which lives on the stack for the call.
    unsafe { set_window_size(master.as_fd().as_raw_fd(), &size) }?;
    Ok(())
}

/// One direction of the master side (each its own descriptor, a `dup` of the master).
#[derive(Debug)]
pub struct Master(AsyncFd<OwnedFd>);

impl Master {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: an OwnedFd is a valid open descriptor that stays open and the same for as
        // long as the AsyncFd owns it.
        let registered = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Master(registered))
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), unfilled)?)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every holder of the slave closed it: the session's end of output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = match self.0.poll_write_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match guard.try_io(|fd| Ok(nix::unistd::write(fd.get_ref(), data)?)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// A terminal has no half-close: EOF is the line discipline's ^D, which the client sends
    /// as data.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
