//! Parsers of the Alibaba GPU trace (the FGD paper's `openb` node and pod lists) from CSV text
//! into typed rows; a malformed row is an error naming its line and column.

use std::collections::HashMap;

/// One node of the node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    /// The GPU model; `None` for a node without GPUs (`nan` or empty in the file).
    pub model: Option<String>,
}

/// One pod of a pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Milli-GPU asked of each GPU: 1000 for whole GPUs, less for a share, 0 without GPUs.
    pub gpu_milli: u32,
    /// Allowed GPU models; empty means any.
    pub gpu_spec: Vec<String>,
    pub creation_time: Option<u64>,
    pub deletion_time: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("the file is empty: no header line")]
    NoHeader,
    #[error("the header has no column `{column}`")]
    MissingColumn { column: &'static str },
    #[error("line {line}: {found} fields, the header has {expected}")]
    FieldCount {
        line: usize,
        expected: usize,
        found: usize,
    },
    #[error("line {line}, column `{column}`: {value:?} is not {expected}")]
    BadValue {
        line: usize,
        column: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Column positions, found by name so that extra columns and any order are accepted.
struct Columns<'a> {
    index: HashMap<&'a str, usize>,
    count: usize,
}

impl<'a> Columns<'a> {
    fn from_header(header: &'a str) -> Self {
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let count = names.len();
        let index = names.into_iter().enumerate().map(|(i, n)| (n, i)).collect();
        Columns { index, count }
    }

    fn find(&self, column: &'static str) -> Result<usize, TraceError> {
        self.index
            .get(column)
            .copied()
            .ok_or(TraceError::MissingColumn { column })
    }
}

/// The header, and the data lines with their 1-based line numbers.
type Lines<'a> = (&'a str, Vec<(usize, &'a str)>);

/// Splits the text into its header and data lines, skipping blank lines.
fn data_lines(text: &str) -> Result<Lines<'_>, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines.next().ok_or(TraceError::NoHeader)?;
    Ok((header, lines.collect()))
}

fn split_fields(line: usize, row: &str, expected: usize) -> Result<Vec<&str>, TraceError> {
    let fields: Vec<&str> = row.split(',').map(str::trim).collect();
    if fields.len() != expected {
        return Err(TraceError::FieldCount {
            line,
            expected,
            found: fields.len(),
        });
    }
    Ok(fields)
}

fn is_missing(value: &str) -> bool {
    value.is_empty() || value.eq_ignore_ascii_case("nan")
}

fn parse_num<T: std::str::FromStr>(
    line: usize,
    column: &'static str,
    value: &str,
) -> Result<T, TraceError> {
    value.parse().map_err(|_| TraceError::BadValue {
        line,
        column,
        value: value.to_owned(),
        expected: "a non-negative integer",
    })
}

fn parse_name(line: usize, column: &'static str, value: &str) -> Result<String, TraceError> {
    if value.is_empty() {
        return Err(TraceError::BadValue {
            line,
            column,
            value: value.to_owned(),
            expected: "a non-empty name",
        });
    }
    Ok(value.to_owned())
}

fn parse_time(line: usize, column: &'static str, value: &str) -> Result<Option<u64>, TraceError> {
    if is_missing(value) {
        return Ok(None);
    }
    parse_num(line, column, value).map(Some)
}

/// Parses a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn parse_nodes(text: &str) -> Result<Vec<NodeRow>, TraceError> {
    let (header, lines) = data_lines(text)?;
    let cols = Columns::from_header(header);
    let (sn, cpu, mem, gpu, model) = (
        cols.find("sn")?,
        cols.find("cpu_milli")?,
        cols.find("memory_mib")?,
        cols.find("gpu")?,
        cols.find("model")?,
    );
    let mut rows = Vec::with_capacity(lines.len());
    for (line, row) in lines {
        let f = split_fields(line, row, cols.count)?;
        let gpus: u32 = parse_num(line, "gpu", f[gpu])?;
        let model_text = f[model];
        let model = if is_missing(model_text) {
            None
        } else {
            Some(model_text.to_owned())
        };
        if gpus > 0 && model.is_none() {
            return Err(TraceError::BadValue {
                line,
                column: "model",
                value: model_text.to_owned(),
                expected: "a GPU model (the node has GPUs)",
            });
        }
        rows.push(NodeRow {
            name: parse_name(line, "sn", f[sn])?,
            cpu_milli: parse_num(line, "cpu_milli", f[cpu])?,
            memory_mib: parse_num(line, "memory_mib", f[mem])?,
            gpus,
            model,
        });
    }
    Ok(rows)
}

/// Parses a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...,creation_time,
/// deletion_time,...`); the last three may be absent; other columns (qos, phase, scheduled
/// time) are ignored.
pub fn parse_pods<'a>(text: &'a str) -> Result<Vec<PodRow>, TraceError> {
    let (header, lines) = data_lines(text)?;
    let cols = Columns::from_header(header);
    let (name, cpu, mem, num, milli) = (
        cols.find("name")?,
        cols.find("cpu_milli")?,
        cols.find("memory_mib")?,
        cols.find("num_gpu")?,
        cols.find("gpu_milli")?,
    );
    // Some pod lists of the trace (multigpu50) have only the five request columns.
    let (spec, created, deleted) = (
        cols.find("gpu_spec").ok(),
        cols.find("creation_time").ok(),
        cols.find("deletion_time").ok(),
    );
    let field = |f: &[&'a str], i: Option<usize>| i.map_or("", |i| f[i]);
    let mut rows = Vec::with_capacity(lines.len());
    for (line, row) in lines {
        let f = split_fields(line, row, cols.count)?;
        let num_gpu: u32 = parse_num(line, "num_gpu", f[num])?;
        let gpu_milli: u32 = parse_num(line, "gpu_milli", f[milli])?;
        // The three request shapes the simulator knows: CPU-only, one share, whole GPUs.
        let valid = match num_gpu {
            0 => gpu_milli == 0,
            1 => (1..=1000).contains(&gpu_milli),
            _ => gpu_milli == 1000,
        };
        if !valid {
            return Err(TraceError::BadValue {
                line,
                column: "gpu_milli",
                value: f[milli].to_owned(),
                expected: "0 without GPUs, 1..=1000 for one GPU, 1000 for several",
            });
        }
        let spec_text = field(&f, spec);
        let gpu_spec = if is_missing(spec_text) {
            Vec::new()
        } else {
            spec_text
                .split('|')
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect()
        };
        rows.push(PodRow {
            name: parse_name(line, "name", f[name])?,
            cpu_milli: parse_num(line, "cpu_milli", f[cpu])?,
            memory_mib: parse_num(line, "memory_mib", f[mem])?,
            num_gpu,
            gpu_milli,
            gpu_spec,
            creation_time: parse_time(line, "creation_time", field(&f, created))?,
            deletion_time: parse_time(line, "deletion_time", field(&f, deleted))?,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
        n0,64000,262144,2,P100\n\
        n1,32000,262144,0,nan\n";

    const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    #[test]
    fn parses_nodes() {
        let rows = parse_nodes(NODES).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].model.as_deref(), Some("P100"));
        assert_eq!(rows[0].gpus, 2);
        assert_eq!(rows[1].model, None);
    }

    #[test]
    fn parses_pods_with_spec_and_missing_times() {
        let text = format!(
            "{POD_HEADER}p0,12000,16384,1,460,V100M16|V100M32,LS,Running,5,,5\r\np1,4000,100,0,0,,BE,Running,,,\n"
        );
        let rows = parse_pods(&text).unwrap();
        assert_eq!(rows[0].gpu_spec, vec!["V100M16", "V100M32"]);
        assert_eq!(rows[0].gpu_milli, 460);
        assert_eq!(rows[0].creation_time, Some(5));
        assert_eq!(rows[0].deletion_time, None);
        assert_eq!(rows[1].num_gpu, 0);
    }

    #[test]
    fn names_line_and_column_of_a_bad_number() {
        let text = format!(
            "{POD_HEADER}p0,12000,16384,1,460,,LS,Running,0,1,0\np1,x,1,1,1000,,LS,R,0,1,0\n"
        );
        let err = parse_pods(&text).unwrap_err();
        assert_eq!(
            err,
            TraceError::BadValue {
                line: 3,
                column: "cpu_milli",
                value: "x".into(),
                expected: "a non-negative integer"
            }
        );
        assert!(err.to_string().contains("line 3"));
    }

    #[test]
    fn rejects_inconsistent_gpu_requests() {
        for bad in ["2,500", "0,100", "1,1001", "1,0"] {
            let text = format!("{POD_HEADER}p0,1,1,{bad},,LS,R,0,1,0\n");
            let err = parse_pods(&text).unwrap_err();
            assert!(
                matches!(
                    err,
                    TraceError::BadValue {
                        line: 2,
                        column: "gpu_milli",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn rejects_wrong_field_count_and_missing_columns() {
        let err = parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,1,2,3\n").unwrap_err();
        assert_eq!(
            err,
            TraceError::FieldCount {
                line: 2,
                expected: 5,
                found: 4
            }
        );
        let err = parse_nodes("sn,cpu_milli,gpu,model\n").unwrap_err();
        assert_eq!(
            err,
            TraceError::MissingColumn {
                column: "memory_mib"
            }
        );
        assert_eq!(parse_pods(""), Err(TraceError::NoHeader));
    }

    #[test]
    fn the_request_columns_alone_are_enough() {
        let rows =
            parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,2,8,1000\n").unwrap();
        assert_eq!(rows[0].num_gpu, 8);
        assert!(rows[0].gpu_spec.is_empty());
        assert_eq!(rows[0].creation_time, None);
    }

    #[test]
    fn rejects_a_gpu_node_without_model() {
        let err = parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,1,2,3,nan\n").unwrap_err();
        assert!(matches!(
            err,
            TraceError::BadValue {
                line: 2,
                column: "model",
                ..
            }
        ));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(text in "\\PC{0,300}", tail in "[0-9a-z,|\\n]{0,200}") {
            let _ = parse_nodes(&text);
            let _ = parse_pods(&text);
            let _ = parse_nodes(&format!("sn,cpu_milli,memory_mib,gpu,model\n{tail}"));
            let _ = parse_pods(&format!("{POD_HEADER}{tail}"));
        }
    }
}
