-- A member's caps count the reservations they made for teams (created_by) as well as their
-- own: this index finds them.
CREATE INDEX reservations_created_by ON reservations (created_by, status) WHERE created_by IS NOT NULL;
