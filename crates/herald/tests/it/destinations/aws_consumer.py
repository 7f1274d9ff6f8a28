"""The consumer side of the Amazon destination tests, against the moto server: makes the
IAM user, queues, topics and event buses the tests publish to, and reads the queues back
with boto3 (AWS's own SDK), independently of Herald's code.

    python aws_consumer.py STATE_DIR ENDPOINT COMMAND [ARG...]

Every command but `drain` prints JSON. `drain` reads a queue until it is killed, keeping
each message it deletes as a line of STATE_DIR/<queue>.jsonl (oldest first), which the
tests read.
"""

import json
import os
import sys
import time

import boto3
import botocore.exceptions

REGION = "us-east-1"
ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def client(state, endpoint, service):
    with open(os.path.join(state, "keys.json")) as f:
        keys = json.load(f)
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=keys["accessKeyId"],
        aws_secret_access_key=keys["secretAccessKey"],
    )


def init(state, endpoint):
    """The IAM user everything is signed as (moto's first unauthenticated requests)."""
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam.create_user(UserName="herald")
    iam.put_user_policy(UserName="herald", PolicyName="all", PolicyDocument=json.dumps(ALLOW_ALL))
    key = iam.create_access_key(UserName="herald")["AccessKey"]
    keys = {"accessKeyId": key["AccessKeyId"], "secretAccessKey": key["SecretAccessKey"]}
    with open(os.path.join(state, "keys.json"), "w") as f:
        json.dump(keys, f)
    return keys


def queue(state, endpoint, name, fifo=""):
    sqs = client(state, endpoint, "sqs")
    attributes = {"FifoQueue": "true"} if fifo == "fifo" else {}
    return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def queue_arn(sqs, url):
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def topic(state, endpoint, name):
    """A topic, delivering raw (body and attributes as published) to the queue <name>-sink."""
    sns, sqs = client(state, endpoint, "sns"), client(state, endpoint, "sqs")
    arn = sns.create_topic(Name=name)["TopicArn"]
    sink = queue_arn(sqs, queue(state, endpoint, name + "-sink"))
    sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=sink, Attributes={"RawMessageDelivery": "true"})
    return arn


def bus(state, endpoint, name):
    """An event bus whose one rule sends every event to the queue <name>-sink."""
    events, sqs = client(state, endpoint, "events"), client(state, endpoint, "sqs")
    events.create_event_bus(Name=name)
    sink = queue_arn(sqs, queue(state, endpoint, name + "-sink"))
    events.put_rule(Name="everything", EventBusName=name, EventPattern=json.dumps({"source": [{"prefix": ""}]}))
    events.put_targets(Rule="everything", EventBusName=name, Targets=[{"Id": "sink", "Arn": sink}])
    return name


def consumed(message, kind):
    """A message as the tests compare it: body, headers (lower-case) and SQS attributes,
    with the queue's id for it (moto, like SQS, may give a message to two readers)."""
    attributes = {**message.get("Attributes", {}), "MessageId": message["MessageId"]}
    if kind == "eventbridge":
        event = json.loads(message["Body"])
        detail = event["detail"]
        extra = {"detail-type": event["detail-type"], "source": event["source"]}
        return {"body": detail["body"], "headers": detail["headers"], "attributes": {**attributes, **extra}}
    headers = {name: value["StringValue"] for name, value in message.get("MessageAttributes", {}).items()}
    return {"body": message["Body"], "headers": headers, "attributes": attributes}


def pending(state, endpoint, name):
    """How many messages the queue holds that no drainer has taken (0 if it does not
    exist)."""
    sqs = client(state, endpoint, "sqs")
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except botocore.exceptions.ClientError:
        return 0
    names = ["ApproximateNumberOfMessages"]
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"][names[0]])


def drain(state, endpoint, name, kind):
    """Reads the queue for ever (until killed): each message is deleted once it is kept in
    STATE_DIR/<queue>.jsonl, one JSON line each. moto's SQS slows down with every message
    a queue holds, so the queue is kept short."""
    sqs = client(state, endpoint, "sqs")
    while True:
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            break
        except botocore.exceptions.ClientError:
            time.sleep(0.1)
    # Ready: the tests wait for every drainer to get here before they publish.
    open(os.path.join(state, f"{name}.ready.{os.getpid()}"), "w").close()
    # Several drainers may share the file: each writes whole lines, appended.
    with open(os.path.join(state, name + ".jsonl"), "a") as kept:
        while True:
            # Long polling: an idle reader waits in moto instead of asking again and again.
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600, WaitTimeSeconds=1,
                                      MessageAttributeNames=["All"], AttributeNames=["All"])
            messages = got.get("Messages", [])
            if not messages:
                continue
            os.write(kept.fileno(), "".join(json.dumps(consumed(m, kind)) + "\n" for m in messages).encode())
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
            sqs.delete_message_batch(QueueUrl=url, Entries=entries)


def main():
    state, endpoint, command, *args = sys.argv[1:]
    commands = {"init": init, "queue": queue, "topic": topic, "bus": bus, "drain": drain, "pending": pending}
    print(json.dumps(commands[command](state, endpoint, *args)))


if __name__ == "__main__":
    main()
