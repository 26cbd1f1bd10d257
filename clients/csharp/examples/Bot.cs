// Bot.cs - a console player of the relay over the C# binding (the counterpart of
// clients/c/examples/relay_player.c): connects with the socket driver, takes every frame in
// order, sends one input per frame, and prints one JSON line at exit:
//   {"player":..., "frames":N, "first":..., "last":..., "gaps":0, "duplicates":0,
//    "hash":"<hex>", "final_frames":..., "end_reason":..., "errors":[...],
//    "gc_bytes_per_frame":..., ...}
// The hash is a running 64-bit FNV-1a over each frame taken:
//   u32 number LE, u32 slot count LE; per slot 0xFF if nil else 0x01, u16 length LE, bytes;
//   u32 event count LE; per event u8 kind, u32 slot LE, u8 name length, name bytes.
// Exit status 0 only without errors.
//
// Usage: mono Bot.exe --server HOST:PORT --room R --player P [--seconds S] [--token T]
//        [--reconnect-at S] [--reconnect-token T] [--spectator] [--input-delay N]
//        mono Bot.exe --selftest     (struct sizes and offsets as JSON; no library needed)
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
        public string Host = "127.0.0.1";
        public int Port = 7777;
        public string Room;
        public string Player;
        public double Seconds = 10.0;
        public string Token;
        public string ReconnectToken;
        public double ReconnectAt = -1.0;
        public bool Spectator;
        public int InputDelay = 0;
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
            Console.Error.WriteLine("usage: Bot.exe --server HOST:PORT --room R --player P [--seconds S] "
                                    + "[--token T] [--reconnect-at S] [--reconnect-token T] [--spectator] "
                                    + "[--input-delay N] | --selftest");
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
                    if (o.Host.Length == 0)
                        o.Host = "127.0.0.1";
                    o.Port = port;
                    break;
                }
                case "--room": o.Room = next(); break;
                case "--player": o.Player = next(); break;
                case "--seconds": o.Seconds = double.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--token": o.Token = next(); break;
                case "--reconnect-token": o.ReconnectToken = next(); break;
                case "--reconnect-at": o.ReconnectAt = double.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--input-delay": o.InputDelay = int.Parse(next(), CultureInfo.InvariantCulture); break;
                case "--spectator": o.Spectator = true; break;
                case "--selftest": o.SelfTest = true; break;
                default: throw new ArgumentException("unknown argument " + a);
            }
        }
        if (!o.SelfTest && o.Token == null && (o.Room == null || o.Player == null))
            throw new ArgumentException("--room and --player are required without --token");
        return o;
    }

    static int Play(Options o)
    {
        var errors = new List<string>();
        string endReason = "deadline";
        long frames = 0, gaps = 0, duplicates = 0;
        long first = -1, last = -1;
        long expected = 0;
        ulong hash = FnvOffset;
        uint finalFrames = 0;
        int slot = -1;
        long inputsSent = 0;
        var input = new byte[8];
        var buffer = new byte[4096];
        var name = new byte[256];

        // Allocation tracking over the steady state (from frame 30 to the end of play).
        const int SteadyFrom = 30;
        long gcMemoryBefore = 0, gcMemoryAfter = 0, gcFramesBefore = 0, gcExcluded = 0;
        BindAllocationCounter();
        int gcCollectionsBefore = 0, gcCollectionsAfter = 0;
        bool steady = false;

        RelayClient client = null;
        try
        {
            var config = RelayClientConfig.Default;
            if (o.InputDelay > 0)
                config.InputDelay = (uint)o.InputDelay;
            client = RelayClient.Create(config);
            client.Open(o.Host, o.Port);
            double start = RelayClient.Time;
            double deadline = start + o.Seconds;
            client.Connect(o.Room, o.Player, o.Spectator, o.Token, start);
            bool reconnected = false;
            bool playing = false;       // inputs flowing (room running, we are a player)
            bool done = false;

            while (!done)
            {
                double now = RelayClient.Time;
                if (now >= deadline)
                    break;
                if (o.ReconnectAt >= 0 && !reconnected && now >= start + o.ReconnectAt)
                {
                    reconnected = true;
                    long beforeReconnect = steady ? allocatedBytes() : 0;
                    client.Reopen();
                    client.Reconnect(o.ReconnectToken, now);
                    if (steady)     // a rare call (and the first call of its entry points)
                        gcExcluded += allocatedBytes() - beforeReconnect;
                }
                client.Update(now);

                // Events are the one allocating path (their strings): kept out of the count.
                long beforeEvents = steady ? allocatedBytes() : 0;
                RelayEvent ev;
                while (client.PollEvent(out ev))
                {
                    switch (ev.Type)
                    {
                        case RelayEventType.Welcome:
                            slot = ev.Slot;
                            break;
                        case RelayEventType.Refused:
                            errors.Add("refused: " + ev.Code + (ev.Text.Length > 0 ? " (" + ev.Text + ")" : ""));
                            break;
                        case RelayEventType.Desync:
                            errors.Add("desync at frame " + ev.Frame + ": " + ev.Code + " " + ev.Text);
                            break;
                        case RelayEventType.Notice:
                            errors.Add("notice: " + ev.Code + " " + ev.Text);
                            break;
                        case RelayEventType.Disconnected:
                            endReason = ev.Code;
                            break;
                    }
                }
                if (steady)
                    gcExcluded += allocatedBytes() - beforeEvents;

                // Start of play: one input covers the frames up to the input delay.
                if (!playing && !o.Spectator && client.State == RelayState.Joined
                    && client.RoomState == RelayRoomState.Running)
                {
                    playing = true;
                    if (SendInput(client, input, slot, inputsSent) > 0)
                        inputsSent++;
                }

                RelayFrame frame;
                while (client.NextFrame(out frame))
                {
                    long number = frame.Number;
                    if (number != expected)
                    {
                        if (number < expected)
                        {
                            duplicates++;
                            continue;
                        }
                        gaps += number - expected;
                    }
                    expected = number + 1;
                    if (first < 0)
                        first = number;
                    last = number;
                    frames++;

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
                        if (!client.FrameEvent(e, out fe))
                            continue;
                        int length = fe.CopyName(name);
                        if (length < 0)
                            length = 0;
                        hash = Mix(hash, (byte)fe.Kind);
                        hash = MixU32(hash, (uint)fe.Slot);
                        hash = Mix(hash, (byte)length);
                        hash = MixBytes(hash, name, length);
                    }

                    if (playing)
                    {
                        if (SendInput(client, input, slot, inputsSent) > 0)
                            inputsSent++;
                    }

                    if (!steady && frames == SteadyFrom)
                    {
                        steady = true;
                        gcFramesBefore = frames;
                        gcCollectionsBefore = GC.CollectionCount(0);
                        gcMemoryBefore = allocatedBytes();
                    }
                }
                if (client.LastError != RelayError.Ok && errors.Count == 0)
                    errors.Add("frame stream broken: " + RelayException.CodeName((int)client.LastError));

                if (client.Finished)
                {
                    done = true;
                    if (client.RoomState == RelayRoomState.Ended)
                        endReason = "ended";
                    break;
                }
                double wait = deadline - RelayClient.Time;
                if (wait > 0)
                    client.Wait(wait < 0.005 ? wait : 0.005);
            }

            if (steady)
            {
                gcMemoryAfter = allocatedBytes();
                gcCollectionsAfter = GC.CollectionCount(0);
            }
            finalFrames = client.FinalFrames;
            // A spectator gets no frames after the end (docs/RELAY_PROTOCOL.md section 11).
            if (client.RoomState == RelayRoomState.Ended && !o.Spectator && last + 1 != finalFrames)
                errors.Add("room ended with " + finalFrames + " frames, took " + (last + 1));

            // Leave and let the LEAVE and DISCONNECT go out.
            if (client.State != RelayState.Idle)
            {
                double now = RelayClient.Time;
                client.Leave(now);
                double flushUntil = now + 0.5;
                while (client.State != RelayState.Idle && RelayClient.Time < flushUntil)
                {
                    client.Update(RelayClient.Time);
                    client.Wait(0.01);
                }
                client.Update(RelayClient.Time);
            }
        }
        catch (RelayException error)
        {
            errors.Add(error.Message);
        }
        catch (DllNotFoundException error)
        {
            errors.Add("native library not found: " + error.Message);
        }
        catch (EntryPointNotFoundException error)
        {
            errors.Add("native entry point missing: " + error.Message);
        }
        finally
        {
            if (client != null)
                client.Dispose();
        }

        if (frames == 0)
            errors.Add("no frames");
        if (gaps > 0)
            errors.Add(gaps + " frames missing");
        if (duplicates > 0)
            errors.Add(duplicates + " frames duplicated");

        double bytesPerFrame = 0.0;
        long measured = frames - gcFramesBefore;
        if (steady && measured > 0)
            bytesPerFrame = Math.Max(0L, gcMemoryAfter - gcMemoryBefore - gcExcluded) / (double)measured;

        var json = new StringBuilder();
        json.Append('{');
        Field(json, "player", Quote(o.Player)); json.Append(", ");
        Field(json, "slot", slot.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "frames", frames.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "first", first < 0 ? "null" : first.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "last", last < 0 ? "null" : last.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "gaps", gaps.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "duplicates", duplicates.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "hash", Quote(hash.ToString("x16"))); json.Append(", ");
        Field(json, "final_frames", finalFrames.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "end_reason", Quote(endReason)); json.Append(", ");
        Field(json, "inputs_sent", inputsSent.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "gc_bytes_per_frame", bytesPerFrame.ToString("0.###", CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "gc_collections", (gcCollectionsAfter - gcCollectionsBefore).ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        Field(json, "gc_counter", Quote(allocationCounter)); json.Append(", ");
        Field(json, "gc_frames_measured", measured.ToString(CultureInfo.InvariantCulture)); json.Append(", ");
        json.Append("\"errors\": [");
        for (int i = 0; i < errors.Count; i++)
        {
            if (i > 0)
                json.Append(", ");
            json.Append(Quote(errors[i]));
        }
        json.Append("]}");
        Console.WriteLine(json.ToString());
        return errors.Count == 0 ? 0 : 1;
    }

    // Our input: u32 slot LE, u32 sequence LE (the number of inputs sent before it).
    static int SendInput(RelayClient client, byte[] input, int slot, long sequence)
    {
        uint s = (uint)slot, n = (uint)sequence;
        input[0] = (byte)s; input[1] = (byte)(s >> 8); input[2] = (byte)(s >> 16); input[3] = (byte)(s >> 24);
        input[4] = (byte)n; input[5] = (byte)(n >> 8); input[6] = (byte)(n >> 16); input[7] = (byte)(n >> 24);
        return client.SendInput(input, input.Length);
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
            "events_dropped", "EventsDropped", "live_frames_dropped", "LiveFramesDropped"));
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
