//! The demo's live chart: admitted and limited requests per second over the last minute,
//! and the rate-limit fields of the last `429`, drawn with ratatui.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Direction, Layout};
use ratatui::style::{Color, Style, Stylize};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Wrap};
use ratatui::{DefaultTerminal, Frame};

use super::{traffic, Args, Figures, Log};

/// How many seconds the chart shows.
const SPAN: usize = 60;

/// What the screen is drawn from.
struct Screen {
    title: String,
    figures: Arc<Mutex<Figures>>,
    rate: Arc<AtomicU32>,
    log: Log,
    start: Instant,
}

/// Drives traffic at the server on `addr` and draws it until `q` (or `--seconds`), then
/// prints the totals.
pub(super) async fn run(addr: SocketAddr, args: &Args, log: Log, title: String) -> ExitCode {
    let figures = Arc::new(Mutex::new(Figures::default()));
    let rate = Arc::new(AtomicU32::new(args.rate));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let driver = {
        let (figures, rate, stop, keys) = (
            figures.clone(),
            rate.clone(),
            stop.clone(),
            args.keys.clone(),
        );
        tokio::spawn(async move {
            let result = traffic(addr, &keys, &rate, &stop, &figures, start).await;
            stop.store(true, Ordering::Relaxed);
            result
        })
    };
    // (a run too long for the clock to hold its end has none)
    let until = args
        .seconds_given
        .then(|| start.checked_add(Duration::from_secs(args.seconds)))
        .flatten();
    let screen = Screen {
        title,
        figures: figures.clone(),
        rate,
        log,
        start,
    };
    let ui_stop = stop.clone();
    let ui = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut terminal = ratatui::try_init()?;
        let result = draw_until_done(&mut terminal, &screen, &ui_stop, until);
        ratatui::restore();
        result
    });
    let ui_result = ui.await;
    stop.store(true, Ordering::Relaxed);
    let driven = driver.await;
    match ui_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("cannot draw in this terminal ({e}); try the demo without --chart");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("the chart failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Ok(Err(e)) = driven {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    let Ok(f) = figures.lock() else {
        return ExitCode::FAILURE;
    };
    let (ok, limited, unavailable) = f
        .seconds
        .iter()
        .fold((0, 0, 0), |t, s| (t.0 + s.0, t.1 + s.1, t.2 + s.2));
    println!("total: {ok} admitted, {limited} limited, {unavailable} unavailable");
    ExitCode::SUCCESS
}

/// Redraws four times a second and handles keys, until `q`, Esc, Ctrl-C, the deadline, or
/// the traffic stopping.
fn draw_until_done(
    terminal: &mut DefaultTerminal,
    screen: &Screen,
    stop: &AtomicBool,
    until: Option<Instant>,
) -> std::io::Result<()> {
    while !stop.load(Ordering::Relaxed) && until.is_none_or(|t| Instant::now() < t) {
        terminal.draw(|frame| draw(frame, screen))?;
        if !event::poll(Duration::from_millis(250))? {
            continue;
        }
        let Event::Key(key) = event::read()? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => break,
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => break,
            KeyCode::Char('+') | KeyCode::Up => {
                let r = screen.rate.load(Ordering::Relaxed);
                screen
                    .rate
                    .store((r + r / 4).max(r + 1).min(10_000), Ordering::Relaxed);
            }
            KeyCode::Char('-') | KeyCode::Down => {
                let r = screen.rate.load(Ordering::Relaxed);
                screen.rate.store((r - r / 5).max(1), Ordering::Relaxed);
            }
            _ => {}
        }
    }
    Ok(())
}

fn draw(frame: &mut Frame<'_>, screen: &Screen) {
    let (seconds, last_limited) = match screen.figures.lock() {
        Ok(f) => (f.seconds.clone(), f.last_limited.clone()),
        Err(_) => return,
    };
    // Whole seconds only: the current one is still filling.
    let done = (screen.start.elapsed().as_secs() as usize).min(seconds.len());
    let from = done.saturating_sub(SPAN);
    let shown = &seconds[from..done];
    let points = |pick: fn(&(u32, u32, u32)) -> u32| -> Vec<(f64, f64)> {
        shown
            .iter()
            .enumerate()
            .map(|(i, s)| ((from + i + 1) as f64, f64::from(pick(s))))
            .collect()
    };
    let admitted = points(|s| s.0);
    let limited = points(|s| s.1);
    let unavailable = points(|s| s.2);
    let rate = screen.rate.load(Ordering::Relaxed);
    let top = shown
        .iter()
        .map(|s| s.0.max(s.1).max(s.2))
        .max()
        .unwrap_or(0)
        .max(rate)
        .max(1);
    let y_max = f64::from(top) * 1.15;

    let [head, body, foot] = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(10),
            Constraint::Length(9),
        ])
        .areas(frame.area());
    frame.render_widget(
        Line::from(vec![
            " tollgate demo ".bold().reversed(),
            format!("  {}  ·  {rate} requests/s  ·  ", screen.title).into(),
            "+/-".bold(),
            " rate  ".into(),
            "q".bold(),
            " quit".into(),
        ]),
        head,
    );

    let mut datasets = vec![
        Dataset::default()
            .name("admitted")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::default().fg(Color::Green))
            .data(&admitted),
        Dataset::default()
            .name("limited (429)")
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(Style::default().fg(Color::Red))
            .data(&limited),
    ];
    if unavailable.iter().any(|p| p.1 > 0.0) {
        datasets.push(
            Dataset::default()
                .name("unavailable (503)")
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::default().fg(Color::Yellow))
                .data(&unavailable),
        );
    }
    let x0 = from as f64;
    let x1 = (from + SPAN) as f64;
    let chart = Chart::new(datasets)
        .block(Block::bordered().title(" requests per second "))
        .x_axis(
            Axis::default()
                .title("seconds")
                .style(Style::default().fg(Color::Gray))
                .bounds([x0, x1])
                .labels([
                    format!("{from}"),
                    format!("{}", from + SPAN / 2),
                    format!("{}", from + SPAN),
                ]),
        )
        .y_axis(
            Axis::default()
                .style(Style::default().fg(Color::Gray))
                .bounds([0.0, y_max])
                .labels([
                    "0".to_string(),
                    format!("{}", (y_max / 2.0).round()),
                    format!("{}", y_max.round()),
                ]),
        );
    frame.render_widget(chart, body);

    let [left, right] = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(62), Constraint::Percentage(38)])
        .areas(foot);
    let fields: Vec<Line<'_>> = if last_limited.is_empty() {
        vec![Line::from("no request limited yet").italic()]
    } else {
        last_limited
            .iter()
            .map(|(name, value)| Line::from(vec![format!("{name}: ").bold(), value.clone().into()]))
            .collect()
    };
    frame.render_widget(
        Paragraph::new(fields)
            .wrap(Wrap { trim: false })
            .block(Block::bordered().title(" the last 429 said ")),
        left,
    );
    let (ok, no, down) = seconds.iter().fold((0u64, 0u64, 0u64), |t, s| {
        (
            t.0 + u64::from(s.0),
            t.1 + u64::from(s.1),
            t.2 + u64::from(s.2),
        )
    });
    let mut lines = vec![
        Line::from(vec!["admitted ".into(), ok.to_string().green().bold()]),
        Line::from(vec!["limited ".into(), no.to_string().red().bold()]),
        Line::from(vec![
            "unavailable ".into(),
            down.to_string().yellow().bold(),
        ]),
    ];
    lines.extend(screen.log.last(3).into_iter().map(|l| Line::from(l).dim()));
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(" totals ")),
        right,
    );
}
