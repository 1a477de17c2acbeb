-- The images a node's Engine has (JSON array of name:tag), as its agent last reported them:
-- placement prefers, among equal fits, a node that has a reservation's image.
ALTER TABLE nodes ADD COLUMN images TEXT;
