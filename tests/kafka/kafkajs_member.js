// A KafkaJS (2.x) group consumer for tests/kafka/test_kafkajs.py: it says what it does as one
// JSON object a line on stdout -- {"joined": ...}, {"record": {"offset", "value"}}, {"crash": why} --
// and leaves the group on SIGTERM (exit 0).
//
// node kafkajs_member.js BOOTSTRAP TOKEN TOPIC GROUP FROM_BEGINNING(0|1)
// (kafkajs is found through NODE_PATH; SASL/PLAIN: any user, the server's token for a password)

const { Kafka, logLevel } = require('kafkajs')

const [bootstrap, token, topic, groupId, fromBeginning] = process.argv.slice(2)
const say = obj => process.stdout.write(JSON.stringify(obj) + '\n')

const kafka = new Kafka({
  clientId: 'shmq-test-kafkajs',
  brokers: [bootstrap],
  sasl: { mechanism: 'plain', username: 'anyone', password: token },
  logLevel: logLevel.WARN,
  retry: { retries: 3 },
})
const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 1000 })

consumer.on(consumer.events.GROUP_JOIN, e => say({ joined: e.payload.memberAssignment }))
consumer.on(consumer.events.CRASH, e => say({ crash: String(e.payload.error), restart: e.payload.restart }))

let stopping = false
process.on('SIGTERM', async () => {
  if (stopping) return
  stopping = true
  try {
    await consumer.disconnect()
  } finally {
    process.exit(0)
  }
})

const main = async () => {
  await consumer.connect()
  await consumer.subscribe({ topic, fromBeginning: fromBeginning === '1' })
  await consumer.run({
    eachMessage: async ({ message }) => {
      say({ record: { offset: Number(message.offset), value: message.value.toString() } })
    },
  })
}

main().catch(e => {
  say({ crash: String(e), restart: false })
  process.exit(1)
})
