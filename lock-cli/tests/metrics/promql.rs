//! Just enough of Prometheus to evaluate an alert rule on one scrape: the text exposition
//! read into samples, the labels a Prometheus server adds when it stores them (its target
//! labels, under the default `honor_labels: false`), and an instant-query evaluator for
//! the part of PromQL the README's rules use: selectors with `=` and `!=` matchers,
//! numbers, `time()`, `sum`/`min`/`max`/`count` with `by (…)`, `+ - * /`, the filtering
//! comparisons `> < >= <= == !=`, and `and`, `or`, `unless`, with PromQL's precedence and
//! one-to-one matching on every label but the metric name.

use std::collections::BTreeMap;

/// A series' labels, the metric name under `__name__`.
pub type Labels = BTreeMap<String, String>;

/// The name of the metric-name label.
const NAME: &str = "__name__";

/// The samples of a Prometheus text exposition (comments and blank lines left out).
pub fn parse_exposition(text: &str) -> Vec<Labels> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| parse_sample(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// `name{a="b",…} value` as labels, the value under `__value__`.
fn parse_sample(line: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    let (series, value) = line.rsplit_once(' ').ok_or("no value")?;
    let (name, rest) = match series.find('{') {
        Some(i) => (&series[..i], &series[i + 1..]),
        None => (series, ""),
    };
    labels.insert(NAME.to_owned(), name.to_owned());
    let mut chars = rest.chars();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches(',').trim().to_owned();
        if key.is_empty() || key == "}" {
            break;
        }
        if chars.next() != Some('"') {
            return Err(format!("label {key}: no opening quote"));
        }
        let mut value = String::new();
        loop {
            match chars.next().ok_or("unterminated label value")? {
                '\\' => match chars.next().ok_or("dangling escape")? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key, value);
    }
    value
        .parse::<f64>()
        .map_err(|e| format!("value {value:?}: {e}"))?;
    labels.insert("__value__".to_owned(), value.to_owned());
    Ok(labels)
}

/// The samples as a Prometheus server stores them from a target of scrape job `job` at
/// `instance`, with the default `honor_labels: false`: a `job` or `instance` label of the
/// exporter's own is renamed `exported_job` / `exported_instance`, and the target's are
/// added.
pub fn as_stored(samples: &[Labels], job: &str, instance: &str) -> Vec<Labels> {
    samples
        .iter()
        .map(|s| {
            let mut s = s.clone();
            for (label, value) in [("job", job), ("instance", instance)] {
                if let Some(own) = s.remove(label) {
                    s.insert(format!("exported_{label}"), own);
                }
                s.insert(label.to_owned(), value.to_owned());
            }
            s
        })
        .collect()
}

/// The result of an expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Scalar(f64),
    Vector(Vec<(Labels, f64)>),
}

impl Value {
    /// The vector's elements; panics on a scalar.
    pub fn vector(self) -> Vec<(Labels, f64)> {
        match self {
            Value::Vector(v) => v,
            Value::Scalar(s) => panic!("a scalar ({s}), not a vector"),
        }
    }
}

/// Evaluates `expr` at `time` (Unix seconds, what `time()` returns) over `samples` (each
/// series' latest value, as an instant query sees them).
pub fn eval(expr: &str, samples: &[Labels], time: f64) -> Result<Value, String> {
    let tokens = tokenize(expr)?;
    let mut p = Parser {
        tokens,
        pos: 0,
        samples,
        time,
    };
    let value = p.or()?;
    match p.peek() {
        None => Ok(value),
        Some(t) => Err(format!("unexpected {t:?}")),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Number(f64),
    Str(String),
    Punct(&'static str),
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    const PUNCT: [&str; 16] = [
        ">=", "<=", "==", "!=", "(", ")", "{", "}", ",", "+", "-", "*", "/", ">", "<", "=",
    ];
    let mut tokens = Vec::new();
    let mut rest = expr;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if c == '#' {
            rest = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            tokens.push(Token::Ident(rest[..end].to_owned()));
            rest = &rest[end..];
        } else if c.is_ascii_digit() || c == '.' {
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e'))
                .unwrap_or(rest.len());
            let n = rest[..end]
                .parse()
                .map_err(|e| format!("number {:?}: {e}", &rest[..end]))?;
            tokens.push(Token::Number(n));
            rest = &rest[end..];
        } else if c == '"' {
            let end = rest[1..].find('"').ok_or("unterminated string")? + 1;
            tokens.push(Token::Str(rest[1..end].to_owned()));
            rest = &rest[end + 1..];
        } else {
            let p = PUNCT
                .iter()
                .find(|p| rest.starts_with(**p))
                .ok_or_else(|| format!("unexpected {c:?}"))?;
            tokens.push(Token::Punct(p));
            rest = &rest[p.len()..];
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    pos: usize,
    samples: &'a [Labels],
    time: f64,
}

/// The labels binary operators match on: all but the metric name.
fn signature(labels: &Labels) -> Labels {
    let mut l = labels.clone();
    l.remove(NAME);
    l
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Result<Token, String> {
        let t = self.tokens.get(self.pos).cloned().ok_or("unexpected end")?;
        self.pos += 1;
        Ok(t)
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Token::Punct(q)) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_punct(&mut self, p: &str) -> Result<(), String> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err(format!("expected {p:?}, found {:?}", self.peek()))
        }
    }

    fn eat_ident(&mut self, word: &str) -> bool {
        if matches!(self.peek(), Some(Token::Ident(w)) if w == word) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Lowest precedence: `or`.
    fn or(&mut self) -> Result<Value, String> {
        let mut lhs = self.and()?;
        while self.eat_ident("or") {
            let rhs = self.and()?;
            lhs = set_op("or", lhs, rhs)?;
        }
        Ok(lhs)
    }

    /// `and`, `unless`.
    fn and(&mut self) -> Result<Value, String> {
        let mut lhs = self.comparison()?;
        loop {
            let op = if self.eat_ident("and") {
                "and"
            } else if self.eat_ident("unless") {
                "unless"
            } else {
                return Ok(lhs);
            };
            let rhs = self.comparison()?;
            lhs = set_op(op, lhs, rhs)?;
        }
    }

    fn comparison(&mut self) -> Result<Value, String> {
        let mut lhs = self.additive()?;
        while let Some(op) = [">=", "<=", "==", "!=", ">", "<"]
            .into_iter()
            .find(|op| matches!(self.peek(), Some(Token::Punct(p)) if p == op))
        {
            self.pos += 1;
            if self.eat_ident("bool") {
                return Err("the bool modifier is not supported".to_owned());
            }
            let rhs = self.additive()?;
            lhs = binary(op, lhs, rhs)?;
        }
        Ok(lhs)
    }

    fn additive(&mut self) -> Result<Value, String> {
        let mut lhs = self.multiplicative()?;
        loop {
            let op = if self.eat_punct("+") {
                "+"
            } else if self.eat_punct("-") {
                "-"
            } else {
                return Ok(lhs);
            };
            let rhs = self.multiplicative()?;
            lhs = binary(op, lhs, rhs)?;
        }
    }

    fn multiplicative(&mut self) -> Result<Value, String> {
        let mut lhs = self.unary()?;
        loop {
            let op = if self.eat_punct("*") {
                "*"
            } else if self.eat_punct("/") {
                "/"
            } else {
                return Ok(lhs);
            };
            let rhs = self.unary()?;
            lhs = binary(op, lhs, rhs)?;
        }
    }

    fn unary(&mut self) -> Result<Value, String> {
        if self.eat_punct("-") {
            let v = self.unary()?;
            return binary("*", Value::Scalar(-1.0), v);
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Value, String> {
        match self.next()? {
            Token::Number(n) => Ok(Value::Scalar(n)),
            Token::Punct("(") => {
                let v = self.or()?;
                self.expect_punct(")")?;
                Ok(v)
            }
            Token::Ident(word) if word == "time" => {
                self.expect_punct("(")?;
                self.expect_punct(")")?;
                Ok(Value::Scalar(self.time))
            }
            Token::Ident(word) if ["sum", "min", "max", "count"].contains(&word.as_str()) => {
                self.aggregation(&word)
            }
            Token::Ident(name) => self.selector(name),
            other => Err(format!("unexpected {other:?}")),
        }
    }

    /// `AGG by (l, …) (expr)` or `AGG (expr) by (l, …)`; without `by`, one group.
    fn aggregation(&mut self, op: &str) -> Result<Value, String> {
        let mut by = if self.eat_ident("by") {
            Some(self.label_list()?)
        } else {
            None
        };
        if matches!(self.peek(), Some(Token::Ident(w)) if w == "without") {
            return Err("without is not supported".to_owned());
        }
        self.expect_punct("(")?;
        let inner = self.or()?;
        self.expect_punct(")")?;
        if by.is_none() && self.eat_ident("by") {
            by = Some(self.label_list()?);
        }
        let by = by.unwrap_or_default();
        let Value::Vector(inner) = inner else {
            return Err(format!("{op} of a scalar"));
        };
        let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
        for (labels, v) in inner {
            let key: Labels = labels.into_iter().filter(|(k, _)| by.contains(k)).collect();
            groups.entry(key).or_default().push(v);
        }
        let fold = |vs: Vec<f64>| match op {
            "sum" => vs.iter().sum::<f64>(),
            "min" => vs.iter().copied().fold(f64::INFINITY, f64::min),
            "max" => vs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            _ => vs.len() as f64,
        };
        Ok(Value::Vector(
            groups.into_iter().map(|(k, vs)| (k, fold(vs))).collect(),
        ))
    }

    fn label_list(&mut self) -> Result<Vec<String>, String> {
        self.expect_punct("(")?;
        let mut labels = Vec::new();
        loop {
            match self.next()? {
                Token::Ident(l) => labels.push(l),
                Token::Punct(")") => return Ok(labels),
                other => return Err(format!("unexpected {other:?} in a label list")),
            }
            if !self.eat_punct(",") {
                self.expect_punct(")")?;
                return Ok(labels);
            }
        }
    }

    /// `name` or `name{l="v", l!="v", …}`: the series of that name that match.
    fn selector(&mut self, name: String) -> Result<Value, String> {
        let mut matchers: Vec<(String, bool, String)> = Vec::new();
        if self.eat_punct("{") {
            while !self.eat_punct("}") {
                let Token::Ident(label) = self.next()? else {
                    return Err("expected a label name".to_owned());
                };
                let equal = if self.eat_punct("=") {
                    true
                } else if self.eat_punct("!=") {
                    false
                } else {
                    return Err(format!("unsupported matcher after {label}"));
                };
                let Token::Str(value) = self.next()? else {
                    return Err("expected a quoted label value".to_owned());
                };
                matchers.push((label, equal, value));
                self.eat_punct(",");
            }
        }
        let found = self
            .samples
            .iter()
            .filter(|s| s.get(NAME) == Some(&name))
            .filter(|s| {
                matchers.iter().all(|(label, equal, value)| {
                    let has = s.get(label).map(String::as_str).unwrap_or("");
                    (has == value) == *equal
                })
            })
            .map(|s| {
                let mut labels = s.clone();
                let value = labels
                    .remove("__value__")
                    .expect("a sample has a value")
                    .parse()
                    .expect("checked when read");
                (labels, value)
            })
            .collect();
        Ok(Value::Vector(found))
    }
}

/// `+ - * /` and the filtering comparisons, with one-to-one matching between vectors.
fn binary(op: &str, lhs: Value, rhs: Value) -> Result<Value, String> {
    let comparison = [">", "<", ">=", "<=", "==", "!="].contains(&op);
    let apply = |a: f64, b: f64| -> f64 {
        match op {
            "+" => a + b,
            "-" => a - b,
            "*" => a * b,
            "/" => a / b,
            _ => unreachable!(),
        }
    };
    let holds = |a: f64, b: f64| match op {
        ">" => a > b,
        "<" => a < b,
        ">=" => a >= b,
        "<=" => a <= b,
        "==" => a == b,
        _ => a != b,
    };
    // Arithmetic drops the metric name; a comparison keeps the series it filters.
    let result_labels = |l: Labels| if comparison { l } else { signature(&l) };
    Ok(match (lhs, rhs) {
        (Value::Scalar(_), Value::Scalar(_)) if comparison => {
            return Err("a comparison of scalars needs bool".to_owned())
        }
        (Value::Scalar(a), Value::Scalar(b)) => Value::Scalar(apply(a, b)),
        (Value::Vector(v), Value::Scalar(s)) => Value::Vector(
            v.into_iter()
                .filter(|(_, a)| !comparison || holds(*a, s))
                .map(|(l, a)| (result_labels(l), if comparison { a } else { apply(a, s) }))
                .collect(),
        ),
        (Value::Scalar(s), Value::Vector(v)) => Value::Vector(
            v.into_iter()
                .filter(|(_, b)| !comparison || holds(s, *b))
                .map(|(l, b)| (result_labels(l), if comparison { b } else { apply(s, b) }))
                .collect(),
        ),
        (Value::Vector(lv), Value::Vector(rv)) => {
            let mut right: BTreeMap<Labels, f64> = BTreeMap::new();
            for (l, v) in rv {
                if right.insert(signature(&l), v).is_some() {
                    return Err(format!("many-to-many matching on the right of {op}"));
                }
            }
            let mut out = Vec::new();
            for (l, a) in lv {
                let Some(&b) = right.get(&signature(&l)) else {
                    continue;
                };
                if comparison {
                    if holds(a, b) {
                        out.push((l, a));
                    }
                } else {
                    out.push((signature(&l), apply(a, b)));
                }
            }
            Value::Vector(out)
        }
    })
}

/// `and`, `or`, `unless` between vectors, matching on every label but the name.
fn set_op(op: &str, lhs: Value, rhs: Value) -> Result<Value, String> {
    let (Value::Vector(lv), Value::Vector(rv)) = (lhs, rhs) else {
        return Err(format!("{op} needs two vectors"));
    };
    let right: Vec<Labels> = rv.iter().map(|(l, _)| signature(l)).collect();
    let in_right = |l: &Labels| right.contains(&signature(l));
    Ok(Value::Vector(match op {
        "and" => lv.into_iter().filter(|(l, _)| in_right(l)).collect(),
        "unless" => lv.into_iter().filter(|(l, _)| !in_right(l)).collect(),
        _ => {
            let left: Vec<Labels> = lv.iter().map(|(l, _)| signature(l)).collect();
            let mut out = lv;
            out.extend(
                rv.into_iter()
                    .filter(|(l, _)| !left.contains(&signature(l))),
            );
            out
        }
    }))
}

/// The `expr` of the alert rule named `alert` in the YAML blocks of the markdown `text`
/// (a one-line `expr: …` or a block `expr: |` and its more-indented lines).
pub fn rule_expr(text: &str, alert: &str) -> Option<String> {
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != format!("- alert: {alert}"));
    lines.next()?;
    let expr_line = lines.find(|l| l.trim_start().starts_with("expr:"))?;
    let indent = expr_line.len() - expr_line.trim_start().len();
    let value = expr_line.trim_start()["expr:".len()..].trim();
    if value != "|" {
        return Some(value.to_owned());
    }
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .collect();
    Some(body.join("\n").trim().to_owned())
}
