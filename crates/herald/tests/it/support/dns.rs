//! A stub DNS server on a loopback UDP port, answering from a script: the tests point
//! Herald's `delivery.dns_servers` at it to play hostile name servers (rebinding, mixed
//! answers, CNAMEs to `localhost`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, CNAME};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

/// One answer record.
#[derive(Debug, Clone)]
pub enum Answer {
    A(Ipv4Addr),
    Cname(&'static str),
}

/// Answers for a name (lowercase, no trailing dot), given how many A queries it got before.
type Script = dyn Fn(&str, usize) -> Option<Vec<Answer>> + Send + Sync;

pub struct StubDns {
    pub addr: SocketAddr,
    queries: Arc<Mutex<HashMap<String, usize>>>,
}

impl StubDns {
    /// Starts the server; names the script does not know get NXDOMAIN. Answers have TTL 0
    /// so that nothing is cached.
    pub async fn start(script: impl Fn(&str, usize) -> Option<Vec<Answer>> + Send + Sync + 'static) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let queries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let counts = queries.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                let Ok(request) = Message::from_vec(&buf[..n]) else { continue };
                let response = answer(&request, &*script, &counts);
                let _ = socket.send_to(&response.to_vec().unwrap(), from).await;
            }
        });
        Self { addr, queries }
    }

    /// How many A queries `name` got.
    pub fn queries(&self, name: &str) -> usize {
        self.queries.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

fn answer(request: &Message, script: &Script, counts: &Mutex<HashMap<String, usize>>) -> Message {
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    response.add_queries(request.queries().to_vec());
    let Some(query) = request.queries().first() else { return response };
    let name = query.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    let seen = {
        let mut counts = counts.lock().unwrap();
        let count = counts.entry(name.clone()).or_default();
        let seen = *count;
        if query.query_type() == RecordType::A {
            *count += 1;
        }
        seen
    };
    let Some(answers) = script(&name, seen) else {
        response.set_response_code(ResponseCode::NXDomain);
        return response;
    };
    for answer in answers {
        match answer {
            Answer::A(ip) if query.query_type() == RecordType::A => {
                response.add_answer(Record::from_rdata(query.name().clone(), 0, RData::A(A(ip))));
            }
            Answer::Cname(target) => {
                let target = Name::from_ascii(target).unwrap();
                response.add_answer(Record::from_rdata(query.name().clone(), 0, RData::CNAME(CNAME(target))));
            }
            Answer::A(_) => {}
        }
    }
    response
}
