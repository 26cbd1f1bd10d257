// Bot.cs - a console player of the relay over the C# binding: the C# counterpart of
// clients/c/examples/relay_player.c, with the same options, input rule, frame hash and JSON
// line, so that tests/clients can put C, C# and Python clients in one room and compare them.
// It joins a room, plays, and prints ONE JSON line on stdout at exit:
//
//   {"player": P, "slot": S, "frames": N, "first": 0, "last": N-1, "gaps": 0, "duplicates": 0,
//    "hash": "<16 hex digits>", "final_frames": F or null, "end_reason": R, ...statistics,
//    "gc_bytes_per_frame": 0, ..., "errors": [...]}
//
// Exit status 0 only if "errors" is empty.
//
//   mono Bot.exe --server HOST:PORT --room R --player P [--spectator] [--token TEXT]
//                [--seconds S] [--input-delay N] [--auto-input-delay]
//                [--reconnect-at SECONDS] [--reconnect-token TEXT] [--rebind-at SECONDS] [--leave]
//   mono Bot.exe --selftest      (struct sizes and offsets as JSON; needs no native library)
//
// --seconds: stop after S seconds even if the room has not ended (end_reason "seconds");
// --reconnect-at: a new connection from a new socket (Reopen + Reconnect), as after a crash,
// with --reconnect-token as its token in token mode (tokens are single-use);
// --rebind-at: a new local port under the same connection (address migration);
// --leave: send LEAVE before disconnecting at the end.
//
// The input, sent every loop iteration while the room runs (the library sends one per frame):
// 8 bytes, FNV-1a 32 of the player name (u32 LE; of "?" without a slot or a name), then the
// number of frames taken when it was sent (u32 LE). The running hash is reported as the
// checksum every 30 frames (players only), so a DESYNC is an error.
//
// "hash": FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over, for every
// frame taken, in order:
//   u32 LE frame number, u32 LE slot count,
//   per slot: nil -> the byte 0xFF; an input -> the byte 0x01, u16 LE length, the bytes;
//   u32 LE event count, per event: u8 kind code (join 0, leave 1, timeout 2, reconnect 3),
//   u32 LE slot, u8 name length (UTF-8 bytes), the name.
// (Synthesized marks are not hashed.) Printed as 16 lowercase hex digits.
//
// "gc_bytes_per_frame": managed bytes allocated per frame from frame 30 to the end of play,
// event polling and reconnects excluded: 0 shows the per-frame path allocates nothing.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Runtime.InteropServices;
using System.Text;
using Relay.Client;

static class Bot
{
    const ulong FnvOffset = 0xcbf29ce484222325UL;
    const ulong FnvPrime = 0x100000001b3UL;

    // Bytes allocated so far: GC.GetAllocatedBytesForCurrentThread where the runtime has it
    // (mono, .NET Core 3+, .NET Standard 2.1; bound once by reflection to stay .NET Standard
    // 2.0), else GC.GetTotalMemory(false), which does not see mono's nursery.
    static Func<long> allocatedBytes;
    static string allocationCounter;

    static void BindAllocationCounter()
    {
        var method = typeof(GC).GetMethod("GetAllocatedBytesForCurrentThread", Type.EmptyTypes);
        if (method != null)
        {
            allocatedBytes = (Func<long>)Delegate.CreateDelegate(typeof(Func<long>), method);
            allocationCounter = "allocated_bytes_for_current_thread";
        }
        else
        {
            allocatedBytes = () => GC.GetTotalMemory(false);
            allocationCounter = "total_memory";
        }
    }

    static ulong Mix(ulong hash, byte value)
    {
        return (hash ^ value) * FnvPrime;
    }

    static ulong MixU16(ulong hash, uint value)
    {
        hash = Mix(hash, (byte)value);
        return Mix(hash, (byte)(value >> 8));
    }

    static ulong MixU32(ulong hash, uint value)
    {
        hash = Mix(hash, (byte)value);
        hash = Mix(hash, (byte)(value >> 8));
        hash = Mix(hash, (byte)(value >> 16));
        return Mix(hash, (byte)(value >> 24));
    }

    static ulong MixBytes(ulong hash, byte[] data, int length)
    {
        for (int i = 0; i < length; i++)
            hash = (hash ^ data[i]) * FnvPrime;
        return hash;
    }

    class Options
    {
        public string Host;
        public int Port;
        public string Room;
        public string Player;
        public double Seconds = 600.0;
        public string Token;
        public string ReconnectToken;
        public double ReconnectAt = -1.0;
        public double RebindAt = -1.0;
        public bool Spectator;
        public bool AutoInputDelay;
        public bool Leave;
        public int InputDelay = 2;
        public bool SelfTest;
    }

    static int Main(string[] args)
    {
        Options options;
        try
        {
            options = Parse(args);
        }
        catch (ArgumentException error)
        {
            Console.Error.WriteLine("Bot: " + error.Message);
            Console.Error.WriteLine("usage: Bot.exe --server HOST:PORT --room R --player P [--spectator] "
                                    + "[--token TEXT] [--seconds S] [--input-delay N] [--auto-input-delay] "
                                    + "[--reconnect-at S] [--reconnect-token TEXT] [--rebind-at S] [--leave] "
                                    + "| --selftest");
            return 2;
        }
        if (options.SelfTest)
        {
            Console.WriteLine(SelfTest());
            return 0;
        }
        return Play(options);
    }

    static Options Parse(string[] args)
    {
        var o = new Options();
        for (int i = 0; i < args.Length; i++)
        {
            string a = args[i];
            Func<string> next = () =>
            {
                if (i + 1 >= args.Length)
                    throw new ArgumentException(a + " needs a value");
                return args[++i];
            };
            switch (a)
            {
                case "--server":
                {
                    string text = next();
                    int colon = text.LastIndexOf(':');
                    int port;
                    if (colon < 0 || !int.TryParse(text.Substring(colon + 1), out port) || port <= 0 || port > 65535)
                        throw new ArgumentException("--server " + text + ": expected HOST:PORT");
                    o.Host = text.Substring(0, colon).Trim('[', ']');
                    o.Port = port;
                    break;
                }
                case "--room": o.Room = next(); break;
                case "--player": o.Player = next(); break;
                case "--seconds": o.Seconds = double.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--token": o.Token = next(); break;
                case "--reconnect-token": o.ReconnectToken = next(); break;
                case "--reconnect-at": o.ReconnectAt = double.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--rebind-at": o.RebindAt = double.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--input-delay": o.InputDelay = int.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--auto-input-delay": o.AutoInputDelay = true; break;
                case "--leave": o.Leave = true; break;
                case "--spectator": o.Spectator = true; break;
                case "--selftest": o.SelfTest = true; break;
                default: throw new ArgumentException("unknown argument " + a);
            }
        }
        if (o.SelfTest)
            return o;
        if (o.Host == null)
            throw new ArgumentException("--server HOST:PORT is required");
        if (o.Token == null && (o.Room == null || o.Player == null))
            throw new ArgumentException("--room and --player are required without --token");
        if (o.InputDelay < 1)
            throw new ArgumentException("--input-delay must be at least 1");
        return o;
    }

    const int MaxErrors = 16;

    static void AddError(List<string> errors, string kind, string detail)
    {
        if (errors.Count < MaxErrors)
            errors.Add(detail == null ? kind : kind + ":" + detail);
    }

    static uint Fnv32(byte[] text)
    {
        uint h = 0x811c9dc5u;
        foreach (byte b in text)
        {
            h ^= b;
            h *= 0x01000193u;
        }
        return h;
    }

    static int Play(Options o)
    {
        var errors = new List<string>();
        string endReason = "";
        long frames = 0, gaps = 0, duplicates = 0;
        long first = -1, last = -1;
        ulong hash = FnvOffset;
        long inputsSent = 0;
        var input = new byte[8];
        var buffer = new byte[65536];     // any input (its length is a u16)
        var name = new byte[256];
        uint whoPlayer = Fnv32(Encoding.UTF8.GetBytes(o.Player ?? "?"));
        uint whoUnknown = Fnv32(Encoding.UTF8.GetBytes("?"));
        string label = o.Player ?? "?";

        // Allocation tracking over the steady state (from frame 30 to the end of play).
        const int SteadyFrom = 30;
        long gcMemoryBefore = 0, gcMemoryAfter = 0, gcFramesBefore = 0, gcExcluded = 0;
        int gcCollectionsBefore = 0, gcCollectionsAfter = 0;
        bool steady = false;
        BindAllocationCounter();

        RelayClient client;
        try
        {
            var config = RelayClientConfig.Default;
            config.InputDelay = (uint)o.InputDelay;
            config.AutoInputDelay = o.AutoInputDelay ? 1 : 0;
            config.MaxBlockSize = 32u * 1024 * 1024;
            client = RelayClient.Create(config);
        }
        catch (Exception error)     // RelayException, DllNotFoundException, EntryPointNotFoundException
        {
            Console.Error.WriteLine("Bot: cannot create the client: " + error.Message);
            return 1;
        }

        int slot = -1, inputDelay = 0;
        uint finalFrames = 0;
        bool ended = false;
        RelayStats stats = default(RelayStats);
        try
        {
            double start = RelayClient.Time;
            bool stopping = false;
            try
            {
                client.Open(o.Host, o.Port);
            }
            catch (RelayException)
            {
                AddError(errors, "socket", o.Host);
                stopping = true;
            }
            if (!stopping)
            {
                try
                {
                    client.Connect(o.Room, o.Player, o.Spectator, o.Token, start);
                }
                catch (RelayException error)
                {
                    AddError(errors, "connect", error.Code == RelayError.Token ? "token" : "invalid");
                    stopping = true;
                }
            }
            double rebindAt = o.RebindAt, reconnectAt = o.ReconnectAt;

            while (!stopping)
            {
                double now = RelayClient.Time;
                client.Update(now);

                // Events are the one allocating path (their strings): kept out of the count.
                long beforeEvents = steady ? allocatedBytes() : 0;
                RelayEvent ev;
                while (client.PollEvent(out ev))
                {
                    Console.Error.WriteLine("[" + label + " " + (now - start).ToString("0.000", CultureInfo.InvariantCulture)
                                            + "] event " + (int)ev.Type + " code=" + ev.Code + " text=" + ev.Text
                                            + " frame=" + ev.Frame);
                    if (ev.Type == RelayEventType.Refused)
                    {
                        AddError(errors, "refused", ev.Code);
                        stopping = true;
                    }
                    else if (ev.Type == RelayEventType.Desync)
                    {
                        AddError(errors, "desync", ev.Frame.ToString(CultureInfo.InvariantCulture));
                    }
                    else if (ev.Type == RelayEventType.RoomState && ev.RoomState == RelayRoomState.Ended)
                    {
                        endReason = ev.Code;
                    }
                    else if (ev.Type == RelayEventType.Disconnected && client.RoomState != RelayRoomState.Ended)
                    {
                        if (ev.Code != "remote:shutdown")
                            AddError(errors, "disconnected", ev.Code);
                        endReason = "disconnected:" + ev.Code;
                    }
                }
                if (steady)
                    gcExcluded += allocatedBytes() - beforeEvents;

                RelayFrame frame;
                while (client.NextFrame(out frame))
                {
                    long number = frame.Number;
                    if (number != last + 1)
                    {
                        if (number <= last)
                            duplicates++;
                        else
                            gaps++;
                    }
                    if (first < 0)
                        first = number;
                    last = number;
                    frames++;
                    hash = HashFrame(client, ref frame, hash, buffer, name);
                    if (!o.Spectator && frame.Number % 30 == 29)
                        client.ReportChecksum(frame.Number, hash);

                    if (!steady && frames == SteadyFrom)
                    {
                        steady = true;
                        gcFramesBefore = frames;
                        gcCollectionsBefore = GC.CollectionCount(0);
                        gcMemoryBefore = allocatedBytes();
                    }
                }
                if (client.LastError != RelayError.Ok)
                {
                    AddError(errors, "bad_frame", null);
                    break;
                }
                if (!o.Spectator && client.RoomState == RelayRoomState.Running && client.State == RelayState.Joined)
                {
                    uint who = client.Slot >= 0 && o.Player != null ? whoPlayer : whoUnknown;
                    uint taken = client.NextFrameNumber;
                    for (int k = 0; k < 4; k++)
                    {
                        input[k] = (byte)(who >> (8 * k));
                        input[4 + k] = (byte)(taken >> (8 * k));
                    }
                    int sent = client.SendInput(input, input.Length);
                    if (sent > 0)
                        inputsSent += sent;
                }
                client.Update(now);
                if (client.Finished)
                {
                    if (endReason.Length == 0)
                        endReason = "finished";
                    break;
                }
                if (now - start >= o.Seconds)
                {
                    endReason = "seconds";
                    break;
                }
                if (rebindAt >= 0 && now - start >= rebindAt)
                {
                    rebindAt = -1;
                    long before = steady ? allocatedBytes() : 0;
                    Console.Error.WriteLine("[" + label + "] rebind");
                    try
                    {
                        client.Reopen();
                    }
                    catch (RelayException)
                    {
                        AddError(errors, "rebind", null);
                    }
                    if (steady)     // a rare call (and the first call of its entry point)
                        gcExcluded += allocatedBytes() - before;
                }
                if (reconnectAt >= 0 && now - start >= reconnectAt)
                {
                    reconnectAt = -1;
                    long before = steady ? allocatedBytes() : 0;
                    Console.Error.WriteLine("[" + label + "] reconnect");
                    try
                    {
                        client.Reopen();
                        client.Reconnect(o.ReconnectToken, now);
                    }
                    catch (RelayException)
                    {
                        AddError(errors, "reconnect", null);
                    }
                    if (steady)
                        gcExcluded += allocatedBytes() - before;
                }
                client.Wait(0.01);
            }

            if (steady)
            {
                gcMemoryAfter = allocatedBytes();
                gcCollectionsAfter = GC.CollectionCount(0);
            }

            // Say goodbye: LEAVE (with --leave) and DISCONNECT, pumped for at most a second.
            double bye = RelayClient.Time;
            if (client.State != RelayState.Idle)
            {
                if (o.Leave)
                    client.Leave(bye);
                else
                    client.Disconnect(bye);
                while (client.State != RelayState.Idle && RelayClient.Time - bye < 1.0)
                {
                    client.Update(RelayClient.Time);
                    client.Wait(0.01);
                }
            }
            stats = client.Stats;
            slot = client.Slot;
            inputDelay = client.InputDelay;
            ended = client.RoomState == RelayRoomState.Ended;
            finalFrames = client.FinalFrames;
        }
        catch (RelayException error)
        {
            AddError(errors, "exception", error.Message);
        }
        finally
        {
            client.Dispose();
        }

        double bytesPerFrame = 0.0;
        long measured = steady ? frames - gcFramesBefore : 0;
        if (measured > 0)
            bytesPerFrame = Math.Max(0L, gcMemoryAfter - gcMemoryBefore - gcExcluded) / (double)measured;

        var inv = CultureInfo.InvariantCulture;
        var json = new StringBuilder();
        json.Append('{');
        Field(json, "player", Quote(o.Player ?? "")); json.Append(", ");
        Field(json, "slot", slot.ToString(inv)); json.Append(", ");
        Field(json, "frames", frames.ToString(inv)); json.Append(", ");
        Field(json, "first", first.ToString(inv)); json.Append(", ");
        Field(json, "last", last.ToString(inv)); json.Append(", ");
        Field(json, "gaps", gaps.ToString(inv)); json.Append(", ");
        Field(json, "duplicates", duplicates.ToString(inv)); json.Append(", ");
        Field(json, "hash", Quote(hash.ToString("x16", inv))); json.Append(", ");
        Field(json, "final_frames", ended ? finalFrames.ToString(inv) : "null"); json.Append(", ");
        Field(json, "end_reason", Quote(endReason)); json.Append(", ");
        Field(json, "input_delay", inputDelay.ToString(inv)); json.Append(", ");
        Field(json, "frames_received", stats.FramesReceived.ToString(inv)); json.Append(", ");
        Field(json, "frames_duplicate", stats.FramesDuplicate.ToString(inv)); json.Append(", ");
        Field(json, "blocks_received", stats.BlocksReceived.ToString(inv)); json.Append(", ");
        Field(json, "live_frames_dropped", stats.LiveFramesDropped.ToString(inv)); json.Append(", ");
        Field(json, "datagrams_dropped", stats.DatagramsDropped.ToString(inv)); json.Append(", ");
        Field(json, "rtt", stats.Rtt.ToString("0.0000", inv)); json.Append(", ");
        Field(json, "inputs_sent", inputsSent.ToString(inv)); json.Append(", ");
        Field(json, "gc_bytes_per_frame", bytesPerFrame.ToString("0.###", inv)); json.Append(", ");
        Field(json, "gc_collections", (gcCollectionsAfter - gcCollectionsBefore).ToString(inv)); json.Append(", ");
        Field(json, "gc_counter", Quote(allocationCounter)); json.Append(", ");
        Field(json, "gc_frames_measured", measured.ToString(inv)); json.Append(", ");
        json.Append("\"errors\": [");
        for (int i = 0; i < errors.Count; i++)
        {
            if (i > 0)
                json.Append(", ");
            json.Append(Quote(errors[i]));
        }
        json.Append("]}");
        Console.WriteLine(json.ToString());
        Console.Out.Flush();
        return errors.Count == 0 ? 0 : 1;
    }

    static ulong HashFrame(RelayClient client, ref RelayFrame frame, ulong hash, byte[] buffer, byte[] name)
    {
        hash = MixU32(hash, frame.Number);
        hash = MixU32(hash, (uint)frame.SlotCount);
        for (int s = 0; s < frame.SlotCount; s++)
        {
            int length = client.CopyInput(s, buffer);
            if (length < 0)
            {
                hash = Mix(hash, 0xFF);
            }
            else
            {
                hash = Mix(hash, 0x01);
                hash = MixU16(hash, (uint)length);
                hash = MixBytes(hash, buffer, length);
            }
        }
        hash = MixU32(hash, (uint)frame.EventCount);
        for (int e = 0; e < frame.EventCount; e++)
        {
            RelayFrameEvent fe;
            client.FrameEvent(e, out fe);
            int length = fe.CopyName(name);
            if (length < 0)
                length = 0;
            hash = Mix(hash, (byte)fe.Kind);
            hash = MixU32(hash, (uint)fe.Slot);
            hash = Mix(hash, (byte)length);
            hash = MixBytes(hash, name, length);
        }
        return hash;
    }

    static void Field(StringBuilder json, string key, string value)
    {
        json.Append('"').Append(key).Append("\": ").Append(value);
    }

    static string Quote(string text)
    {
        if (text == null)
            return "null";
        var b = new StringBuilder("\"");
        foreach (char c in text)
        {
            switch (c)
            {
                case '"': b.Append("\\\""); break;
                case '\\': b.Append("\\\\"); break;
                case '\n': b.Append("\\n"); break;
                case '\r': b.Append("\\r"); break;
                case '\t': b.Append("\\t"); break;
                default:
                    if (c < 0x20)
                        b.Append("\\u").Append(((int)c).ToString("x4"));
                    else
                        b.Append(c);
                    break;
            }
        }
        return b.Append('"').ToString();
    }

    // ---- --selftest: the layouts as the runtime marshals them ----

    static string Layout(Type type, params string[] fields)
    {
        // fields: pairs of C name, C# field name
        var b = new StringBuilder();
        b.Append("{\"size\": ").Append(Marshal.SizeOf(type).ToString(CultureInfo.InvariantCulture));
        for (int i = 0; i < fields.Length; i += 2)
        {
            b.Append(", \"").Append(fields[i]).Append("\": ")
             .Append(Marshal.OffsetOf(type, fields[i + 1]).ToInt64().ToString(CultureInfo.InvariantCulture));
        }
        return b.Append('}').ToString();
    }

    static string SelfTest()
    {
        var b = new StringBuilder("{");
        b.Append("\"relay_event_t\": ").Append(Layout(typeof(RelayEventNative),
            "type", "Type", "room_state", "RoomState", "slot", "Slot", "spectator", "Spectator",
            "tick_rate", "TickRate", "next_frame", "NextFrame", "history", "History", "frame", "Frame",
            "delay_frames", "DelayFrames", "response_ms", "ResponseMs", "late", "Late", "inputs", "Inputs",
            "code", "Code", "text", "Text"));
        b.Append(", \"relay_client_stats_t\": ").Append(Layout(typeof(RelayStats),
            "rtt", "Rtt", "rtt_variance", "RttVariance", "loss", "Loss", "packets_sent", "PacketsSent",
            "packets_received", "PacketsReceived", "bytes_sent", "BytesSent", "bytes_received", "BytesReceived",
            "frames_received", "FramesReceived", "frames_duplicate", "FramesDuplicate",
            "blocks_received", "BlocksReceived", "datagrams_dropped", "DatagramsDropped",
            "events_dropped", "EventsDropped", "live_frames_dropped", "LiveFramesDropped",
            "redundancy_mode", "redundancyMode", "reserved", "reserved", "burst_length", "BurstLength"));
        b.Append(", \"relay_frame_t\": ").Append(Layout(typeof(RelayFrame),
            "number", "number", "slot_count", "slotCount", "event_count", "eventCount"));
        b.Append(", \"relay_frame_event_t\": ").Append(Layout(typeof(RelayFrameEvent),
            "kind", "kind", "slot", "slot", "name_length", "nameLength", "name", "name"));
        b.Append(", \"relay_client_config_t\": ").Append(Layout(typeof(RelayClientConfig),
            "allocate", "Allocate", "release", "Release", "allocator_context", "AllocatorContext",
            "random_bytes", "RandomBytes", "random_context", "RandomContext", "mtu", "Mtu",
            "connect_timeout", "ConnectTimeout", "peer_timeout", "PeerTimeout",
            "heartbeat_interval", "HeartbeatInterval", "ack_delay", "AckDelay",
            "max_message_size", "MaxMessageSize", "reassembly_limit", "ReassemblyLimit",
            "max_block_size", "MaxBlockSize", "max_history_size", "MaxHistorySize",
            "frame_buffer_bytes", "FrameBufferBytes", "frame_buffer_count", "FrameBufferCount",
            "input_delay", "InputDelay", "auto_input_delay", "AutoInputDelay",
            "max_input_size", "MaxInputSize", "send_queue", "SendQueue", "event_queue", "EventQueue"));
        return b.Append('}').ToString();
    }
}
