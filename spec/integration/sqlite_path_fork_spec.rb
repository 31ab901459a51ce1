# frozen_string_literal: true

require "tmpdir"
require "acemq/amqp"
require "acemq/amqp/patterns"

# A store the library opens by path (`path:`) built in a parent that then
# forks, as `acemq run --processes N` does after booting the app: SQLite
# forbids using a connection in another process than the one that opened
# it, so each child opens the file again on its first call (and leaks the
# inherited handle unclosed, as the sqlite3 gem 2.x does).
RSpec.describe "a SQLite store opened by path, across fork" do
  # The descriptors this process has open on the database file itself (not
  # its -wal or -shm).
  def handles_on(path)
    Dir.children("/proc/self/fd").count do |fd|
      File.readlink("/proc/self/fd/#{fd}") == path
    rescue SystemCallError
      false
    end
  end

  it "is opened again in each forked child: the children race a key with one winner, the parent's handle untouched" do
    Dir.mktmpdir do |dir|
      path = File.join(dir, "keys.db")
      store = AceMQ::AMQP::Patterns::SQLIdempotencyStore.new(path: path)
      store.create_schema
      expect(store.first_time?("parent-1")).to be(true)
      parent_handles = handles_on(path)

      children = Array.new(3) do |i|
        rd, wr = IO.pipe
        pid = fork do
          rd.close
          inherited = handles_on(path)
          # What a child wins it confirms, as a handler does: a claim left
          # by a child that has exited is a dead worker's on this host, and
          # the next to ask takes it over (docs/ordering.md).
          shared = store.first_time?("shared")
          store.confirm("shared") if shared
          own = store.first_time?("child-#{i}")
          store.confirm("child-#{i}") if own
          wr.write([inherited, handles_on(path), shared, own].join(" "))
          wr.close
          exit!(0)
        end
        wr.close
        [pid, rd]
      end
      said = children.map do |pid, rd|
        out = rd.read
        rd.close
        _, status = Process.wait2(pid)
        expect(status.exitstatus).to eq(0)
        out.split
      end

      expect(said.size).to eq(3)
      said.each do |inherited, after, _shared, own|
        expect(Integer(after)).to eq(Integer(inherited) + 1) # its own handle, opened in the child
        expect(own).to eq("true")
      end
      expect(said.map { |s| s[2] }.tally).to eq("true" => 1, "false" => 2)
      # The parent goes on with its own handle, and sees what the children wrote.
      expect(handles_on(path)).to eq(parent_handles)
      expect(store.first_time?("shared")).to be(false)
      expect(store.first_time?("child-0")).to be(false)
      expect(store.first_time?("parent-2")).to be(true)
    end
  end
end
