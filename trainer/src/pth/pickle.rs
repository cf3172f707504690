//! A pickle machine for the opcodes `torch.save` emits (protocol 2 by default, 3-5 when the
//! caller asks for them), without executing anything: calls to torch's tensor rebuilders
//! become [`TensorRef`]s, `OrderedDict()` becomes a dict, and every other class or call
//! becomes an inert [`Object`] so checkpoints that pickle `argparse.Namespace` or optimizer
//! internals stay readable.
use super::value::{DType, Object, StorageRef, TensorRef, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pickle byte {offset}{}: {reason}", opcode.map(|o| format!(" (opcode {})", describe(o))).unwrap_or_default())]
pub struct PickleError {
    pub offset: usize,
    pub opcode: Option<u8>,
    pub reason: String,
}

fn describe(op: u8) -> String {
    if op.is_ascii_graphic() {
        format!("0x{op:02x} '{}'", op as char)
    } else {
        format!("0x{op:02x}")
    }
}

/// Stack entries: values, or the MARK separating the arguments of TUPLE/SETITEMS/...
enum Slot {
    Mark,
    V(Value),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset and opcode being executed, for errors.
    at: usize,
    op: u8,
    stack: Vec<Slot>,
    memo: HashMap<u32, Value>,
}

/// Unpickles `data` to its root object.
pub fn unpickle(data: &[u8]) -> Result<Value, PickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        at: 0,
        op: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    m.run()
}

impl Machine<'_> {
    fn err(&self, reason: impl Into<String>) -> PickleError {
        PickleError {
            offset: self.at,
            opcode: Some(self.op),
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        if self.data.len() - self.pos < n {
            return Err(self.err(format!(
                "needs {n} more bytes but the pickle ends at byte {} (truncated)",
                self.data.len()
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn len(&mut self, n: u64) -> Result<usize, PickleError> {
        usize::try_from(n).map_err(|_| self.err("length does not fit in memory"))
    }

    fn utf8(&mut self, n: usize) -> Result<String, PickleError> {
        let bytes = self.take(n)?.to_vec();
        String::from_utf8(bytes).map_err(|_| self.err("string is not valid UTF-8"))
    }

    /// A text line (GLOBAL's module and name).
    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err("unterminated line (truncated)"))?;
        let s = self.utf8(n)?;
        self.pos += 1;
        Ok(s)
    }

    fn push(&mut self, v: Value) {
        self.stack.push(Slot::V(v));
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(Slot::V(v)) => Ok(v),
            Some(Slot::Mark) => Err(self.err("expected a value but found a MARK")),
            None => Err(self.err("stack underflow")),
        }
    }

    fn top(&self) -> Result<&Value, PickleError> {
        match self.stack.last() {
            Some(Slot::V(v)) => Ok(v),
            Some(Slot::Mark) => Err(self.err("expected a value but found a MARK")),
            None => Err(self.err("stack underflow")),
        }
    }

    /// Everything above the topmost MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        let items = self
            .stack
            .split_off(at + 1)
            .into_iter()
            .map(|s| match s {
                Slot::V(v) => v,
                Slot::Mark => unreachable!("the topmost mark is at `at`"),
            })
            .collect();
        self.stack.pop();
        Ok(items)
    }

    fn memo_get(&self, i: u32) -> Result<Value, PickleError> {
        self.memo
            .get(&i)
            .cloned()
            .ok_or_else(|| self.err(format!("memo key {i} was never stored")))
    }

    fn memo_put(&mut self, i: u32) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        self.memo.insert(i, v);
        Ok(())
    }

    fn tuple(v: Vec<Value>) -> Value {
        Value::Tuple(Rc::new(v))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.at = self.pos;
            self.op = 0;
            let op = self.u8().map_err(|mut e| {
                e.opcode = None;
                e.reason = "the pickle ends without STOP (truncated)".into();
                e
            })?;
            self.op = op;
            if op == b'.' {
                return self.pop();
            }
            self.step(op)?;
        }
    }

    /// One opcode other than STOP, by kind.
    fn step(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            0x80 | 0x95 | b'(' | b'0' | b'1' | b'2' => self.framing(op),
            b'N' | 0x88 | 0x89 | b'J' | b'K' | b'M' | 0x8a | 0x8b | b'G' => self.numbers(op),
            b'X' | 0x8c | 0x8d | b'T' | b'U' | b'B' | b'C' | 0x8e => self.text(op),
            b'}'
            | b']'
            | b')'
            | 0x8f
            | b'd'
            | b'l'
            | b't'
            | 0x91
            | 0x85..=0x87
            | b's'
            | b'u'
            | b'a'
            | b'e'
            | 0x90 => self.containers(op),
            b'q' | b'r' | 0x94 | b'h' | b'j' => self.memo(op),
            b'c' | 0x93 | b'Q' | b'R' | 0x81 | 0x92 | b'b' => self.objects(op),
            _ => Err(self.unsupported()),
        }
    }

    fn unsupported(&self) -> PickleError {
        self.err("unsupported opcode (not one torch.save emits; is this a torch checkpoint?)")
    }

    /// Protocol, frame, mark, pop and dup: the stack itself.
    fn framing(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            0x80 => {
                let proto = self.u8()?;
                if proto > 5 {
                    return Err(self.err(format!("unsupported pickle protocol {proto}")));
                }
            }
            0x95 => {
                // FRAME: a length prefix only; the frame's opcodes follow inline.
                self.u64()?;
            }
            b'(' => self.stack.push(Slot::Mark),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?.clone();
                self.push(v);
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    /// None, booleans, integers and floats.
    fn numbers(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'J' => {
                let v = self.u32()? as i32;
                self.push(Value::Int(i64::from(v)));
            }
            b'K' => {
                let v = self.u8()?;
                self.push(Value::Int(i64::from(v)));
            }
            b'M' => {
                let v = self.u16()?;
                self.push(Value::Int(i64::from(v)));
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    u64::from(self.u8()?)
                } else {
                    u64::from(self.u32()?)
                };
                let n = self.len(n)?;
                let bytes = self.take(n)?.to_vec();
                self.push(long(&bytes));
            }
            b'G' => {
                let v = f64::from_be_bytes(self.take(8)?.try_into().expect("8"));
                self.push(Value::Float(v));
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    /// Strings and bytes.
    fn text(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => u64::from(self.u32()?),
                    0x8c => u64::from(self.u8()?),
                    _ => self.u64()?,
                };
                let n = self.len(n)?;
                let s = self.utf8(n)?;
                self.push(Value::Str(s));
            }
            // BINSTRING / SHORT_BINSTRING: Python 2 str, as text (torch's keys are ASCII).
            b'T' | b'U' => {
                let n = if op == b'T' {
                    u64::from(self.u32()?)
                } else {
                    u64::from(self.u8()?)
                };
                let n = self.len(n)?;
                let bytes = self.take(n)?.to_vec();
                self.push(match String::from_utf8(bytes) {
                    Ok(s) => Value::Str(s),
                    Err(e) => Value::Bytes(e.into_bytes()),
                });
            }
            b'B' | b'C' | 0x8e => {
                let n = match op {
                    b'B' => u64::from(self.u32()?),
                    b'C' => u64::from(self.u8()?),
                    _ => self.u64()?,
                };
                let n = self.len(n)?;
                let bytes = self.take(n)?.to_vec();
                self.push(Value::Bytes(bytes));
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    /// Building dicts, lists, tuples and sets, and adding to them.
    fn containers(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'}' => self.push(Value::Dict(Rc::new(RefCell::new(Vec::new())))),
            b']' => self.push(Value::List(Rc::new(RefCell::new(Vec::new())))),
            b')' => self.push(Self::tuple(Vec::new())),
            0x8f => self.push(Value::Set(Rc::new(RefCell::new(Vec::new())))),
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                self.push(Value::Dict(Rc::new(RefCell::new(pairs))));
            }
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Value::List(Rc::new(RefCell::new(items))));
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Self::tuple(items));
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Value::Set(Rc::new(RefCell::new(items))));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Self::tuple(items));
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![(k, v)])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                self.set_items(pairs)?;
            }
            b'a' => {
                let v = self.pop()?;
                self.append(vec![v])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.append(items)?;
            }
            0x90 => {
                let items = self.pop_mark()?;
                match self.top()? {
                    Value::Set(s) => s.borrow_mut().extend(items),
                    _ => return Err(self.err("ADDITEMS on something that is not a set")),
                }
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    /// The memo: storing and fetching by index.
    fn memo(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'q' => {
                let i = u32::from(self.u8()?);
                self.memo_put(i)?;
            }
            b'r' => {
                let i = self.u32()?;
                self.memo_put(i)?;
            }
            0x94 => {
                let i = self.memo.len() as u32;
                self.memo_put(i)?;
            }
            b'h' => {
                let i = u32::from(self.u8()?);
                let v = self.memo_get(i)?;
                self.push(v);
            }
            b'j' => {
                let i = self.u32()?;
                let v = self.memo_get(i)?;
                self.push(v);
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    /// Globals, persistent ids (the storages), calls, instances and their state.
    fn objects(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(Value::Global { module, name });
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (module, name) {
                    (Value::Str(module), Value::Str(name)) => {
                        self.push(Value::Global { module, name })
                    }
                    _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                }
            }
            b'Q' => {
                let pid = self.pop()?;
                let storage = self.persistent_load(&pid)?;
                self.push(storage);
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.call(callable, args)?;
                self.push(v);
            }
            0x81 => {
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.instantiate(cls, args)?;
                self.push(v);
            }
            0x92 => {
                let _kwargs = self.pop()?;
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.instantiate(cls, args)?;
                self.push(v);
            }
            b'b' => {
                let state = self.pop()?;
                self.build(state)?;
            }
            _ => return Err(self.unsupported()),
        }
        Ok(())
    }

    fn pairs(&self, items: Vec<Value>) -> Result<Vec<(Value, Value)>, PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for a dict"));
        }
        let mut it = items.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    fn set_items(&mut self, pairs: Vec<(Value, Value)>) -> Result<(), PickleError> {
        match self.top()? {
            Value::Dict(d) => {
                let mut d = d.borrow_mut();
                for (k, v) in pairs {
                    // Python semantics: a repeated key replaces the value in place.
                    let existing = k
                        .as_str()
                        .and_then(|ks| d.iter().position(|(other, _)| other.as_str() == Some(ks)));
                    match existing {
                        Some(i) => d[i].1 = v,
                        None => d.push((k, v)),
                    }
                }
                Ok(())
            }
            // Items set on an unknown object (a dict subclass): keep them as its state.
            Value::Object(o) => {
                let mut o = o.borrow_mut();
                let state = o
                    .state
                    .get_or_insert_with(|| Value::Dict(Rc::new(RefCell::new(Vec::new()))));
                if let Value::Dict(d) = state {
                    d.borrow_mut().extend(pairs);
                }
                Ok(())
            }
            other => Err(self.err(format!("SETITEM(S) on {}", other.short_repr()))),
        }
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        match self.top()? {
            Value::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            Value::Object(o) => {
                o.borrow_mut().args.extend(items);
                Ok(())
            }
            other => Err(self.err(format!("APPEND(S) on {}", other.short_repr()))),
        }
    }

    /// torch's persistent ids: `('storage', storage_class, key, location, numel)`.
    fn persistent_load(&self, pid: &Value) -> Result<Value, PickleError> {
        let parts = match pid {
            Value::Tuple(t) => t.clone(),
            other => {
                return Err(self.err(format!(
                    "persistent id {} is not a tuple",
                    other.short_repr()
                )))
            }
        };
        if parts.first().and_then(Value::as_str) != Some("storage") || parts.len() < 5 {
            return Err(self.err(format!(
                "persistent id {} is not a torch storage",
                pid.short_repr()
            )));
        }
        let dtype = match &parts[1] {
            Value::Global { name, .. } => DType::from_storage_class(name),
            _ => None,
        }
        .ok_or_else(|| {
            self.err(format!(
                "unsupported storage type {}",
                parts[1].short_repr()
            ))
        })?;
        let key = match &parts[2] {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            other => return Err(self.err(format!("storage key {}", other.short_repr()))),
        };
        let numel = parts[4]
            .as_int()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| self.err("storage size is not a non-negative integer"))?;
        Ok(Value::Storage(StorageRef { key, dtype, numel }))
    }

    fn ints(&self, v: &Value, what: &str) -> Result<Vec<i64>, PickleError> {
        v.items()
            .and_then(|items| items.iter().map(Value::as_int).collect::<Option<Vec<_>>>())
            .ok_or_else(|| {
                self.err(format!(
                    "tensor {what} {} is not a tuple of ints",
                    v.short_repr()
                ))
            })
    }

    fn call(&self, callable: Value, args: Value) -> Result<Value, PickleError> {
        let Value::Global { module, name } = &callable else {
            return Err(self.err(format!("REDUCE on {}", callable.short_repr())));
        };
        let argv = match &args {
            Value::Tuple(t) => t.as_ref().clone(),
            other => return Err(self.err(format!("REDUCE arguments {}", other.short_repr()))),
        };
        match (module.as_str(), name.as_str()) {
            ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor") => {
                if argv.len() < 4 {
                    return Err(self.err(format!("{name} needs at least 4 arguments")));
                }
                let Value::Storage(storage) = &argv[0] else {
                    return Err(self.err(format!(
                        "{name}: first argument {} is not a storage",
                        argv[0].short_repr()
                    )));
                };
                let offset = argv[1]
                    .as_int()
                    .ok_or_else(|| self.err("tensor storage offset is not an int"))?;
                let size = self.ints(&argv[2], "size")?;
                let stride = self.ints(&argv[3], "stride")?;
                if size.len() != stride.len() {
                    return Err(self.err(format!(
                        "tensor size {size:?} and stride {stride:?} differ in length"
                    )));
                }
                Ok(Value::Tensor(Rc::new(TensorRef {
                    storage: storage.clone(),
                    offset,
                    size,
                    stride,
                })))
            }
            // A Parameter is its data as far as weights go.
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => argv
                .into_iter()
                .next()
                .filter(|v| matches!(v, Value::Tensor(_)))
                .ok_or_else(|| self.err(format!("{name}: the first argument is not a tensor"))),
            ("collections", "OrderedDict") | ("builtins" | "__builtin__", "dict") => {
                let pairs = match argv.first() {
                    None => Vec::new(),
                    Some(v) => v
                        .items()
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|kv| {
                            let kv = kv.items()?;
                            Some((kv.first()?.clone(), kv.get(1)?.clone()))
                        })
                        .collect(),
                };
                Ok(Value::Dict(Rc::new(RefCell::new(pairs))))
            }
            _ => Ok(Value::Object(Rc::new(RefCell::new(Object {
                module: module.clone(),
                name: name.clone(),
                args: argv,
                state: None,
            })))),
        }
    }

    fn instantiate(&self, cls: Value, args: Value) -> Result<Value, PickleError> {
        let Value::Global { module, name } = &cls else {
            return Err(self.err(format!("NEWOBJ on {}", cls.short_repr())));
        };
        if (module.as_str(), name.as_str()) == ("collections", "OrderedDict") {
            return Ok(Value::Dict(Rc::new(RefCell::new(Vec::new()))));
        }
        Ok(Value::Object(Rc::new(RefCell::new(Object {
            module: module.clone(),
            name: name.clone(),
            args: args.items().unwrap_or_default(),
            state: None,
        }))))
    }

    fn build(&mut self, state: Value) -> Result<(), PickleError> {
        match self.top()? {
            Value::Object(o) => {
                let mut o = o.borrow_mut();
                // `(dict_state, slot_state)` pairs: keep the dict part, as Python would.
                let state = match &state {
                    Value::Tuple(t) if t.len() == 2 && matches!(t[0], Value::Dict(_)) => {
                        t[0].clone()
                    }
                    _ => state,
                };
                o.state = Some(state);
                Ok(())
            }
            // OrderedDict attributes (a state_dict's `_metadata`) and tensor hooks are not
            // weights: drop them.
            Value::Dict(_) | Value::Tensor(_) => Ok(()),
            other => Err(self.err(format!("BUILD on {}", other.short_repr()))),
        }
    }
}

/// LONG1/LONG4 payload: little-endian two's complement.
fn long(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Int(0);
    }
    if bytes.len() > 8 {
        return Value::BigInt(bytes.to_vec());
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
    buf[..bytes.len()].copy_from_slice(bytes);
    Value::Int(i64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memoized_dict_sees_later_items() {
        // {'a': [1, -2]} then fetch the memoized list again: ({'a': [1, -2]}, [1, -2])
        let p = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffesh\x02\x86.";
        let v = unpickle(p).unwrap();
        let items = v.items().unwrap();
        let list = items[0].get("a").unwrap().items().unwrap();
        assert_eq!(
            list.iter().map(|x| x.as_int().unwrap()).collect::<Vec<_>>(),
            [1, -2]
        );
        assert_eq!(items[1].items().unwrap().len(), 2);
    }

    #[test]
    fn long1_is_twos_complement() {
        assert_eq!(long(&[0xff]).as_int(), Some(-1));
        assert_eq!(long(&[0x00, 0x01]).as_int(), Some(256));
        assert_eq!(long(&[0, 0, 0, 0, 0, 1]).as_int(), Some(1 << 40));
    }

    #[test]
    fn errors_name_offset_and_opcode() {
        let e = unpickle(b"\x80\x02K").unwrap_err();
        assert_eq!((e.offset, e.opcode), (2, Some(b'K')));
        assert!(e.reason.contains("truncated"), "{e}");
        let e = unpickle(b"\x80\x02K\x01").unwrap_err();
        assert!(e.reason.contains("without STOP"), "{e}");
        let e = unpickle(b"\x80\x02I1\n.").unwrap_err();
        assert_eq!((e.offset, e.opcode), (2, Some(b'I')));
        assert!(e.to_string().contains("unsupported opcode"), "{e}");
        let e = unpickle(b"\x80\x02h\x07.").unwrap_err();
        assert!(e.reason.contains("memo key 7"), "{e}");
        let e = unpickle(b"\x80\x02u.").unwrap_err();
        assert!(e.reason.contains("no MARK"), "{e}");
    }
}
