// ApiCheck.cs - exercises the binding's surface against Tests~/relay_client_stub.c (a scripted
// stand-in for librelay_client.so): strings both ways, events, frames, zero-copy inputs,
// errors as RelayException, disposal. Prints "ok" or the first failure (exit 1).
using System;
using System.Runtime.InteropServices;
using Relay.Client;

static class ApiCheck
{
    static void Expect(bool condition, string what)
    {
        if (!condition)
            throw new Exception("check failed: " + what);
    }

    static int Main()
    {
        try
        {
            Run();
            Console.WriteLine("ok");
            return 0;
        }
        catch (Exception error)
        {
            Console.WriteLine(error.ToString());
            return 1;
        }
    }

    static void Run()
    {
        var config = RelayClientConfig.Default;
        Expect(config.Mtu == 1200 && config.InputDelay == 2 && config.EventQueue == 256, "default config");
        Expect(Math.Abs(config.AckDelay - 1.0 / 30) < 1e-12 && config.Allocate == IntPtr.Zero, "config doubles");
        try
        {
            RelayClient.Create(config);     // the stub accepts input_delay 3 only
            Expect(false, "create with a refused config throws");
        }
        catch (RelayException error)
        {
            Expect(error.Code == RelayError.Invalid && error.Message.Contains("relay_client_create"), "create error");
        }
        config.InputDelay = 3;
        Expect(RelayClient.MemorySize(config) > 0, "memory size");
        var client = RelayClient.Create(config);
        try
        {
            client.Open("127.0.0.1", 1);
            Expect(false, "open on a bad port throws");
        }
        catch (RelayException error)
        {
            Expect(error.Code == RelayError.Socket && error.Message.Contains("RELAY_ESOCKET"), "socket error: " + error.Message);
        }
        client.Open("127.0.0.1", 7777);
        Expect(client.State == RelayState.Idle && client.Slot == -1, "idle");
        client.Connect("r\u00e9", "p", RelayClient.Time);        // the stub insists on UTF-8 "ré"
        Expect(client.State == RelayState.Connecting, "connecting");
        client.Update(RelayClient.Time);
        RelayEvent ev;
        Expect(client.PollEvent(out ev), "welcome");
        Expect(ev.Type == RelayEventType.Welcome && ev.Slot == 1 && ev.TickRate == 30
               && ev.RoomState == RelayRoomState.Running, "welcome fields");
        Expect(ev.Code == "welcome-code" && ev.Text == "t\u00e9xt", "event strings: " + ev.Code + "/" + ev.Text);
        Expect(!client.PollEvent(out ev) && ev.Type == RelayEventType.None, "no second event");
        Expect(client.Slot == 1 && client.InputDelay == 3 && client.NextFrameNumber == 0, "state");
        client.InputDelay = 4;
        try
        {
            client.InputDelay = 0;
            Expect(false, "input delay 0 throws");
        }
        catch (ArgumentOutOfRangeException)
        {
        }
        RelayFrame frame;
        Expect(!client.NextFrame(out frame), "no frame before update");
        client.Update(RelayClient.Time);
        Expect(client.Have == 0, "have");
        Expect(client.NextFrame(out frame) && frame.Number == 0 && frame.SlotCount == 3 && frame.EventCount == 2, "frame 0");
        var buffer = new byte[16];
        Expect(client.CopyInput(0, buffer) == 2 && buffer[0] == 0 && buffer[1] == (byte)'a', "copy input");
        Expect(client.CopyInput(1, buffer) == (int)RelayError.Nil, "nil input");
        Expect(client.CopyInput(2, buffer) == 0, "empty input");
        Expect(client.CopyInput(9, buffer) == (int)RelayError.Nil && client.CopyInput(-1, buffer) == (int)RelayError.Nil, "past slot count");
        Expect(client.CopyInput(0, new byte[1]) == (int)RelayError.Small, "small buffer");
        IntPtr data;
        Expect(client.Input(0, out data) == 2 && Marshal.ReadByte(data, 1) == (byte)'a', "zero-copy input");
        Expect(client.Input(1, out data) == (int)RelayError.Nil, "zero-copy nil");
        Expect(client.Synthesized(2) && !client.Synthesized(0) && !client.Synthesized(-1), "synthesized");
        RelayFrameEvent fe;
        Expect(client.FrameEvent(1, out fe) && fe.Kind == RelayFrameEventKind.Join && fe.Slot == 1, "frame event");
        Expect(fe.Name == "b\u00f6b" && fe.NameLength == 4, "frame event name: " + fe.Name);
        var name = new byte[8];
        Expect(fe.CopyName(name) == 4 && name[0] == (byte)'b' && fe.CopyName(new byte[2]) == -1, "copy name");
        Expect(!client.FrameEvent(2, out fe) && !client.FrameEvent(-1, out fe), "no third event");
        var input = new byte[8];
        Expect(client.SendInput(input, 8) == 1, "send input");
        Expect(client.SendInput(input, 0) == (int)RelayError.Invalid, "send input: the stub wants 8 bytes");
        Expect(client.SendInputFor(5, input, 8) == 1, "send input for");
        try
        {
            client.SendInput(input, 9);
            Expect(false, "length past the buffer throws");
        }
        catch (ArgumentOutOfRangeException)
        {
        }
        Expect(client.ReportChecksum(0, 0xFFFFFFFFFFFFFFFFUL) == 0, "checksum");
        RelayStats stats = client.Stats;
        Expect(stats.Rtt == 0.25 && stats.LiveFramesDropped == 1, "stats");
        Expect(stats.RedundancyMode == RelayLinkMode.Bursty && stats.BurstLength == 2.5, "stats: link");
        Expect(client.NextDatagram(new byte[1200], RelayClient.Time) == 0, "no datagram");
        try
        {
            client.NextDatagram(new byte[100], RelayClient.Time);
            Expect(false, "a short datagram buffer throws");
        }
        catch (RelayException error)
        {
            Expect(error.Code == RelayError.Small, "ESMALL");
        }
        client.Leave(RelayClient.Time);
        Expect(client.State == RelayState.Idle, "left");
        client.Dispose();
        Expect(client.IsDisposed && client.Handle.IsClosed, "disposed");
        client.Dispose();                   // twice is harmless
        try
        {
            client.Update(RelayClient.Time);
            Expect(false, "use after dispose throws");
        }
        catch (ObjectDisposedException)
        {
        }
        // The SafeHandle alone (no Dispose) releases the client on finalization.
        RelayClient.Create(config);
        GC.Collect();
        GC.WaitForPendingFinalizers();
    }
}
