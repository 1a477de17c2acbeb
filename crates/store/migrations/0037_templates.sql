-- Templates: a named instance setup (image, command, environment, published HTTP ports, where
-- a volume goes) that `reserve --template NAME` starts from. A user's own (owner_id, public 0),
-- or everyone's (public 1): made by an admin, or shipped with gpurent (no owner). command,
-- env and http_ports are JSON.
CREATE TABLE templates (
    id           TEXT PRIMARY KEY,
    owner_id     TEXT REFERENCES users (id),
    name         TEXT NOT NULL,
    image        TEXT,
    command      TEXT NOT NULL DEFAULT '[]',
    env          TEXT NOT NULL DEFAULT '{}',
    http_ports   TEXT NOT NULL DEFAULT '[]',
    volume_mount TEXT,
    description  TEXT,
    public       BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL
);
CREATE UNIQUE INDEX templates_owner_name ON templates (owner_id, name) WHERE public = 0;
CREATE UNIQUE INDEX templates_public_name ON templates (name) WHERE public = 1;
CREATE INDEX templates_owner ON templates (owner_id, name);
-- The shipped ones (docs/templates.md).
INSERT INTO templates (id, owner_id, name, image, command, env, http_ports, volume_mount,
                       description, public, created_at)
VALUES
    ('tpl-shell', NULL, 'shell', NULL, '[]', '{}', '[]', '/workspace',
     'An interactive instance with no image: it stays up for its hours; enter it with gpurent ssh, cp, port-forward or the console''s terminal.',
     1, 1796515200000000),
    ('tpl-jupyter', NULL, 'jupyter', 'jupyter/base-notebook:latest',
     '["sh","-c","exec jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --ServerApp.token= --ServerApp.password= --ServerApp.base_url=/proxy/$GPURENT_RESERVATION_ID/8888/ --ServerApp.allow_remote_access=True"]',
     '{}', '[8888]', '/home/jovyan/work',
     'JupyterLab on port 8888, published for you only at /proxy/ID/8888/ (gpurent open ID 8888).',
     1, 1796515200000000),
    ('tpl-pytorch', NULL, 'pytorch', 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime', '[]',
     '{"PYTHONUNBUFFERED":"1"}', '[]', '/workspace',
     'PyTorch with CUDA: the image''s own shell stays up; enter it with gpurent ssh, or give a command.',
     1, 1796515200000000);
