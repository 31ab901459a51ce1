# frozen_string_literal: true

# Envelope ids are UUIDv7s whose random bits the engine draws from the
# system in bulk (core/src/envelope.rs). A forked child must not go on
# drawing from its parent's bytes: parent and child would then make the same
# ids in the same millisecond.
RSpec.describe "envelope ids" do
  def random_part(id) = id.delete("-")[13..] # after the 48-bit time and the version

  it "are UUIDv7, and a forked child draws other random bits than its parent" do
    AceMQ::AMQP._new_id # the parent's buffer is filled before the fork
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.puts(Array.new(50) { AceMQ::AMQP._new_id }.join(","))
      writer.close
      exit!(0)
    end
    writer.close
    parent = Array.new(50) { AceMQ::AMQP._new_id }
    child = reader.read.strip.split(",")
    Process.wait(pid)
    expect(child.size).to eq(50)
    expect((parent + child).map { |id| id[14] }.uniq).to eq(["7"])
    expect(parent.map { |id| random_part(id) } & child.map { |id| random_part(id) }).to be_empty
  end
end
