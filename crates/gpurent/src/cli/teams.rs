//! `gpurent teams`: a shared balance, members with roles, and the reservations made for it.

use clap::{Subcommand, ValueEnum};

#[derive(Debug, Subcommand)]
pub enum TeamsCommand {
    /// Make a team; you are its first owner. Move credit into it with `credit move`, reserve
    /// for it with `reserve --team NAME`.
    #[command(after_help = "Example:\n  \
                            gpurent teams create lab\n  \
                            gpurent teams add lab ada --role member\n  \
                            gpurent credit move 100 --to-team lab\n  \
                            gpurent reserve --team lab --gpu rtx4090 --hours 1")]
    Create { name: String },
    /// Your teams and your role in each.
    Ls,
    /// A team's balance and members.
    Get { name: String },
    /// Add a user to a team, or change their role (an admin of the team: below owner; an
    /// owner: any role).
    Add {
        team: String,
        user: String,
        #[arg(long, value_enum, default_value = "member")]
        role: TeamRoleArg,
    },
    /// Remove a member (yourself: leave the team; its last owner cannot).
    Rm { team: String, user: String },
}

/// A role in a team: an owner may do everything, its credit included; an admin manage its
/// members; a member reserve, stop and enter; a viewer only look.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TeamRoleArg {
    Owner,
    Admin,
    Member,
    Viewer,
}

impl From<TeamRoleArg> for gpurent_types::TeamRole {
    fn from(role: TeamRoleArg) -> Self {
        match role {
            TeamRoleArg::Owner => Self::Owner,
            TeamRoleArg::Admin => Self::Admin,
            TeamRoleArg::Member => Self::Member,
            TeamRoleArg::Viewer => Self::Viewer,
        }
    }
}
