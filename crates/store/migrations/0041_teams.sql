-- Teams. A team is a principal of its own: a users row of kind 'team' that nobody signs in as
-- (no token, no password), so that its balance, holds, caps, usage and invoices are those of
-- any tenant (accounts user:ID, hold:ID, earnings:ID). Its members and their roles are in
-- team_members. A reservation made for a team has the team as its tenant (it pays) and the
-- member who made it in created_by.
ALTER TABLE users ADD COLUMN kind TEXT NOT NULL DEFAULT 'user';
CREATE TABLE team_members (
    team_id  TEXT NOT NULL REFERENCES users (id),
    user_id  TEXT NOT NULL REFERENCES users (id),
    role     TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
    added_at BIGINT NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_user ON team_members (user_id, team_id);
ALTER TABLE reservations ADD COLUMN created_by TEXT;
