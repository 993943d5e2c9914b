/* GENERATED from shmq/protocol/frames.py: do not edit. Regenerate with
 * python -c 'from shmq.protocol import frames; frames.write_c_header()' */
#ifndef SHMQ_FRAMES_H
#define SHMQ_FRAMES_H

#define WIRE_MAGIC 0xDEADBEEFu
#define WIRE_VERSION 1
#define WIRE_HEADER 16
#define WIRE_REPLY_BIT 0x80
#define WIRE_OK 0
/* request types (MsgType) */
#define MSG_HELLO 0x01
#define MSG_CREATE 0x02
#define MSG_DELETE 0x03
#define MSG_LIST 0x04
#define MSG_STATS 0x05
#define MSG_PURGE 0x06
#define MSG_PING 0x07
#define MSG_CONSUMER_ADD 0x08
#define MSG_CONSUMER_REMOVE 0x09
#define MSG_BACKUP 0x0A
#define MSG_PRODUCE 0x10
#define MSG_PRODUCE_BATCH 0x11
#define MSG_CONSUME 0x12
#define MSG_ACK 0x13
#define MSG_NACK 0x14
#define MSG_EXTEND 0x15
#define MSG_REJECT 0x16
#define MSG_PEEK 0x17
#define MSG_REDRIVE 0x18
#define MSG_SUBSCRIBE 0x19
#define MSG_CANCEL 0x1B
#define MSG_STREAM_CREATE 0x20
#define MSG_STREAM_DELETE 0x21
#define MSG_STREAM_LIST 0x22
#define MSG_STREAM_INFO 0x23
#define MSG_STREAM_STATS 0x24
#define MSG_APPEND 0x28
#define MSG_APPEND_BATCH 0x29
#define MSG_READ 0x2A
#define MSG_OFFSETS 0x2B
#define MSG_PUBLISH 0x2C
#define MSG_PUBLISHED 0x2D
#define MSG_DELETE_RECORDS 0x2E
#define MSG_JOIN 0x30
#define MSG_POLL 0x31
#define MSG_COMMIT 0x32
#define MSG_LEAVE 0x33
#define MSG_ASSIGNMENT 0x34
#define MSG_GROUPS 0x35
#define MSG_COMMITTED 0x36
#define MSG_LAG 0x37
#define MSG_RESET 0x38
#define MSG_SEEK 0x39
#define MSG_PAUSE 0x3A
#define MSG_POLL_MANY 0x3B
#define MSG_TXN_INIT 0x3C
#define MSG_TXN_OFFSETS 0x3D
#define MSG_TXN_END 0x3E
#define MSG_X_CREATE 0x40
#define MSG_X_DELETE 0x41
#define MSG_X_LIST 0x42
#define MSG_X_BIND 0x43
#define MSG_X_UNBIND 0x44
#define MSG_X_PUBLISH 0x45
#define MSG_REQUEST 0x46
#define MSG_KV_OPEN 0x60
#define MSG_KV_LIST 0x61
#define MSG_KV_DROP 0x62
#define MSG_KV_SET 0x63
#define MSG_KV_GET 0x64
#define MSG_KV_GET_MANY 0x65
#define MSG_KV_DELETE 0x66
#define MSG_KV_INCR 0x67
#define MSG_KV_ADD 0x68
#define MSG_KV_MEMBERS 0x69
#define MSG_KV_EXPIRE 0x6A
#define MSG_KV_TTL 0x6B
#define MSG_KV_KEYS 0x6C
#define MSG_KV_CLEAR 0x6D
#define MSG_KV_SWEEP 0x6E

#endif
